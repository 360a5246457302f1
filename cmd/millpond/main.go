// Command millpond administers a millpond outbox database: it installs or
// removes the schema, shows backlog statistics, lists, requeues, reroutes
// and discards dead-lettered events, lists and retires consumer groups,
// moves waiting events of the default group to the groups that take them
// now, purges delivered events past their retention, serves the admin web
// UI (package admin) and relays events to NATS JetStream (package relay).
//
// Usage:
//
//	millpond [-db URL] [-delete-on-ack] <command> [flags]
//
//	millpond migrate [-down -yes] [-lock-timeout 3s]
//	millpond stats [-json]
//	millpond dead list -stream S [-group G | -all-groups] [-after ID] [-limit N] [-json]
//	millpond dead requeue -stream S ID...
//	millpond dead reroute -stream S ID...
//	millpond dead discard -stream S (ID... | [-group G] (-kind K | -all) [-yes | -dry-run])
//	millpond groups list [-stream S] [-json]
//	millpond groups unregister -stream S -group G [-discard [-yes | -dry-run]]
//	millpond pending reroute -stream S
//	millpond purge -older-than 168h [-limit N] [-yes | -dry-run]
//	millpond ui [-addr 127.0.0.1:8081] [-read-only] [-prefix /path] [-hosts names] [-secure-cookie]
//	millpond relay -nats URL -stream S[,S…] [-js-stream N] [-subject-prefix P] [-strict] …
//
// Every command and command group takes -h. The database comes from -db
// (before or after the command) or from the MILLPOND_DATABASE_URL
// environment variable: postgres://, mysql://, sqlite:path or a PostgreSQL
// key=value string. On a database whose stores run with
// outbox.WithDeleteOnAck give -delete-on-ack (before the command) or set
// MILLPOND_DELETE_ON_ACK=1: the commands then open it the same way.
// Passwords, event keys and payloads are never printed. A password given
// with -db (or -nats) is visible to every user of the machine in the
// process list and stays in the shell's history: set MILLPOND_DATABASE_URL
// (and MILLPOND_NATS_URL) instead.
// Commands that delete many events at once (dead discard -kind or -all,
// groups unregister -discard, purge) delete only when confirmed: -yes
// deletes at once; without it they print how many they would delete and,
// on a terminal, ask for a name or the count to be typed; -dry-run only
// counts.
// The exit code is 0 on success, 1 when the command failed, 2 for a usage
// error or a bulk deletion not confirmed, and 3 when a command that changes
// events or groups matched none.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/internal/safetext"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/anydb"
)

// EnvDatabaseURL names the environment variable read when -db is not given.
const EnvDatabaseURL = "MILLPOND_DATABASE_URL"

// EnvDeleteOnAck names the environment variable that, set to 1 or true,
// does what the global -delete-on-ack flag does.
const EnvDeleteOnAck = "MILLPOND_DELETE_ON_ACK"

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2 // also a bulk deletion not confirmed (-yes)
	exitNothing = 3 // requeue, reroute, discard or unregister matched nothing
)

const purgeUsage = `Usage: millpond purge -older-than D [-limit N] [-delete-on-ack] [-yes | -dry-run] [-db URL]

Delete events delivered more than D ago (e.g. 7d or 168h). Their keys may then be
enqueued again. With -delete-on-ack (stores that delete acknowledged rows), also
delete events enqueued more than D ago that no delivery row points at.

It deletes only when confirmed: -yes deletes at once (scheduled purges need it);
without it, it prints how many events it would delete and asks, on a terminal, for
that count, then deletes at most that many. Otherwise nothing is deleted and it
exits 2. -dry-run only prints the count.
`

// purgeChunk is how many rows one Purge statement deletes at most, so a
// large purge never holds one long transaction.
const purgeChunk = 10_000

const usageText = `Usage: millpond [-db URL] [-delete-on-ack] <command> [flags]

Commands:
  migrate [-down -yes] [-lock-timeout D]
                                        install or upgrade the outbox schema (-down -yes removes it and every event)
  stats [-json]                         count pending, processing and dead-lettered events per stream and group
  dead list -stream S [-group G | -all-groups] [-after ID] [-limit N] [-json | -show-keys]
                                        list dead-lettered events, oldest first (keys hidden unless -show-keys)
  dead requeue -stream S ID...          make dead-lettered events pending again, attempts reset
  dead reroute -stream S ID...          move unrouted dead letters to the groups that take their kind now
  dead discard -stream S (ID... | [-group G] (-kind K | -all) [-yes | -dry-run])
                                        delete dead-lettered events for good
  groups list [-stream S] [-json]       list consumer groups: registration, backlog, last activity
  groups unregister -stream S -group G [-discard [-yes | -dry-run]]
                                        retire a group (refused while it has pending or processing events)
  pending reroute -stream S             move pending events of the default group to the groups that take their kind now
  purge -older-than D [-limit N] [-yes | -dry-run]
                                        delete events delivered more than D ago (e.g. 7d)
  ui [-addr 127.0.0.1:8081] [-read-only] serve the admin web UI (loopback by default)
  relay -nats URL -stream S [-js-stream N] [-subject-prefix P] [-strict]
                                        forward a stream's events to NATS JetStream, exactly once, in per-key order

The database is -db URL or $` + EnvDatabaseURL + `:
  postgres://user:pass@host:5432/db?sslmode=disable
  host=127.0.0.1 user=app password=… dbname=app   (PostgreSQL key=value)
  mysql://user:pass@host:3306/db
  sqlite:path/to/file.db
Passwords are never printed. A password given with -db is visible to every
user of the machine in the process list (ps) and stays in the shell's
history: set $` + EnvDatabaseURL + ` instead.

-delete-on-ack (or $` + EnvDeleteOnAck + `=1): the application's stores run with
outbox.WithDeleteOnAck; give it on such a database, so that discards and
reroutes keep the events (the keys' idempotency records) for purge, as those
stores do.

Bulk deletions (dead discard -kind or -all, groups unregister -discard, purge)
delete only when confirmed: -yes deletes at once; without it they print how
many events they would delete and, on a terminal, ask for a name or the count
to be typed. -dry-run only counts.

Run "millpond <command> -h" for a command's flags.

Exit codes: 0 success, 1 failure, 2 usage error or bulk deletion not confirmed,
3 nothing matched (dead requeue, reroute and discard, groups unregister,
pending reroute).
`

const deadUsage = `Usage: millpond dead <subcommand> [flags]

Subcommands:
  list      list dead-lettered events of a stream
  requeue   make dead-lettered events pending again
  reroute   move unrouted dead letters to the groups that take their kind now
  discard   delete dead-lettered events for good

Run "millpond dead <subcommand> -h" for its flags.
`

const groupsUsage = `Usage: millpond groups <subcommand> [flags]

Subcommands:
  list        list consumer groups with their registration, backlog and last activity
  unregister  retire a consumer group (of a renamed or removed handler)

Run "millpond groups <subcommand> -h" for its flags.
`

const pendingUsage = `Usage: millpond pending <subcommand> [flags]

Subcommands:
  reroute   move pending events of the default group to the groups that take their kind now

Run "millpond pending <subcommand> -h" for its flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	e := &env{ctx: ctx, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, stdin: os.Stdin}
	if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		e.interactive = true
	}
	code := runEnv(e, os.Args[1:])
	stop()
	os.Exit(code)
}

// usageError is a mistake in the command line: it exits with code 2.
type usageError struct {
	msg     string
	printed bool // the flag package already printed msg and the usage
}

func (e *usageError) Error() string { return e.msg }

// nothingError reports a command that matched no event or group: it exits
// with code 3.
type nothingError struct{ msg string }

func (e *nothingError) Error() string { return e.msg }

func nothingf(format string, args ...any) error {
	return &nothingError{msg: fmt.Sprintf(format, args...)}
}

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// env carries what a command needs from the outside world.
type env struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	dbURL  string // from the global -db flag, may be empty
	// deleteOnAck opens stores WithDeleteOnAck (the global -delete-on-ack
	// flag or $MILLPOND_DELETE_ON_ACK).
	deleteOnAck bool
	// stdin answers a bulk deletion's confirmation prompt, asked only when
	// interactive (stdin is a terminal); otherwise such a deletion needs
	// -yes.
	stdin       io.Reader
	interactive bool
}

// run executes the command line args (without the program name) and
// returns the process exit code. It is main without the process: tests call
// it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return runEnv(&env{ctx: ctx, stdout: stdout, stderr: stderr, getenv: getenv}, args)
}

// runEnv is run with the whole environment given: main's stdin and whether
// it is a terminal.
func runEnv(e *env, args []string) int {
	stderr := e.stderr
	err := dispatch(e, args)
	var uerr *usageError
	var nerr *nothingError
	var cerr *notConfirmedError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp), errors.Is(err, errDryRun):
		return exitOK
	case errors.As(err, &cerr):
		fmt.Fprintf(stderr, "millpond: %s\n", cerr.msg)
		return exitUsage
	case errors.As(err, &nerr):
		fmt.Fprintf(stderr, "millpond: %s\n", nerr.msg)
		return exitNothing
	case errors.As(err, &uerr):
		if !uerr.printed {
			fmt.Fprintf(stderr, "millpond: %s\n", uerr.msg)
			fmt.Fprintln(stderr, `Run "millpond -h" for usage.`)
		}
		return exitUsage
	default:
		fmt.Fprintf(stderr, "millpond: %s\n", err)
		return exitFailure
	}
}

func dispatch(e *env, args []string) error {
	fs := newFlagSet(e, "millpond", usageText)
	fs.StringVar(&e.dbURL, "db", "", "database URL (default $"+EnvDatabaseURL+")")
	fs.BoolVar(&e.deleteOnAck, "delete-on-ack", false, "the application's stores run with outbox.WithDeleteOnAck: open the database the same way (default $"+EnvDeleteOnAck+")")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{msg: err.Error(), printed: true}
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usagef("no command given")
	}
	cmd, rest := rest[0], rest[1:]
	switch cmd {
	case "help":
		fmt.Fprint(e.stdout, usageText)
		return nil
	case "migrate":
		return cmdMigrate(e, rest)
	case "stats":
		return cmdStats(e, rest)
	case "dead":
		return subcommand(e, "dead", deadUsage, rest, map[string]func(*env, []string) error{
			"list": cmdDeadList, "requeue": cmdDeadRequeue, "reroute": cmdDeadReroute, "discard": cmdDeadDiscard,
		})
	case "groups":
		return subcommand(e, "groups", groupsUsage, rest, map[string]func(*env, []string) error{
			"list": cmdGroupsList, "unregister": cmdGroupsUnregister,
		})
	case "pending":
		return subcommand(e, "pending", pendingUsage, rest, map[string]func(*env, []string) error{
			"reroute": cmdPendingReroute,
		})
	case "purge":
		return cmdPurge(e, rest)
	case "ui":
		return cmdUI(e, rest)
	case "relay":
		return cmdRelay(e, rest)
	default:
		return usagef("unknown command %q", cmd)
	}
}

// subcommand dispatches a command group (dead, groups, pending): -h prints
// the group's usage and exits 0.
func subcommand(e *env, group, usage string, args []string, cmds map[string]func(*env, []string) error) error {
	names := slices.Sorted(maps.Keys(cmds))
	want := strings.Join(names, ", ")
	if len(args) == 0 {
		return usagef("%s: want a subcommand: %s", group, want)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(e.stderr, usage)
		return flag.ErrHelp
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		return usagef("%s: unknown subcommand %q (want %s)", group, args[0], want)
	}
	return cmd(e, args[1:])
}

// newFlagSet returns a flag set that reports errors instead of exiting and
// prints its usage to stderr.
func newFlagSet(e *env, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprint(e.stderr, usage)
		if name != "millpond" {
			fmt.Fprintln(e.stderr, "\nFlags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parse parses flags and positional arguments in any order ("requeue 4 5
// -stream s" and "requeue -stream s 4 5" are the same) and returns the
// positional ones. Flag syntax errors are usage errors; -h is flag.ErrHelp.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			// The flag package has already printed the problem and usage.
			return nil, &usageError{msg: fs.Name() + ": " + err.Error(), printed: true}
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		if args[0] == "--" {
			return append(positional, args[1:]...), nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// addDBFlag lets a command take -db after its name too.
func addDBFlag(fs *flag.FlagSet) *string {
	return fs.String("db", "", "database URL (default $"+EnvDatabaseURL+")")
}

// target is the database a command works on.
type target struct {
	addr  dsn.Address // Raw holds the password; never printed
	shown string      // redacted, for messages
}

// fail wraps a store error for display, scrubbing the address's password.
func (t target) fail(what string, err error) error {
	return fmt.Errorf("%s %s: %s", what, t.shown, t.addr.Scrub(err.Error()))
}

// open connects to the database named by -db or the environment. It never
// starts LISTEN: a short-lived command has nothing to wake.
func open(e *env, local string, opts ...outbox.Option) (*outbox.Store, target, error) {
	return openWith(e, local, append([]outbox.Option{outbox.WithoutListen()}, opts...)...)
}

// openWith is open with the given store options (a long-running command
// such as relay keeps LISTEN on).
func openWith(e *env, local string, opts ...outbox.Option) (*outbox.Store, target, error) {
	raw, addr, err := address(e, local)
	if err != nil {
		return nil, target{}, err
	}
	t := target{addr: addr, shown: addr.String()}
	envOn := false
	if v := strings.TrimSpace(e.getenv(EnvDeleteOnAck)); v != "" {
		// Read strictly: a value taken for false without a word ("yes",
		// "on") would let a discard delete the keys' idempotency records.
		var err error
		if envOn, err = strconv.ParseBool(v); err != nil {
			return nil, target{}, usagef("$%s is %q: want 1 or true (or 0 or false)", EnvDeleteOnAck, v)
		}
	}
	if e.deleteOnAck || envOn {
		// Discards and reroutes then leave the events their rows leave
		// behind (the keys' idempotency records) to purge, as the
		// application's stores do.
		opts = append(opts, outbox.WithDeleteOnAck())
	}
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	s, err := anydb.Open(ctx, raw, opts...)
	if err != nil {
		// Open's error names the redacted address already.
		return nil, t, errors.New(addr.Scrub(err.Error()))
	}
	return s, t, nil
}

func cmdMigrate(e *env, args []string) error {
	fs := newFlagSet(e, "migrate", "Usage: millpond migrate [-down -yes] [-lock-timeout D] [-db URL]\n\nInstall or upgrade the outbox schema; with -down remove it and every event in it.\nA migration that waits longer than -lock-timeout for a table another transaction holds\nrolls back, says so on stderr and tries again after a backoff, until interrupted.\n")
	down := fs.Bool("down", false, "revert every migration: drops the outbox tables and all events (needs -yes)")
	yes := fs.Bool("yes", false, "confirm -down")
	lockTimeout := fs.Duration("lock-timeout", outbox.DefaultMigrationLockTimeout, "longest wait for each table lock; the application's statements queue behind the wait")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("migrate: unexpected argument %q", pos[0])
	}
	if *down && !*yes {
		return usagef("migrate -down deletes every event in the outbox; add -yes to confirm")
	}
	if *lockTimeout <= 0 {
		return usagef("migrate: -lock-timeout must be positive")
	}
	s, db, err := open(e, *dbFlag, outbox.WithMigrationLockTimeout(*lockTimeout),
		outbox.WithLogger(slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		return err
	}
	defer s.Close()
	if *down {
		if err := s.MigrateDown(e.ctx); err != nil {
			return db.fail("migrate down", err)
		}
		fmt.Fprintf(e.stdout, "removed the outbox schema from %s\n", db.shown)
		return nil
	}
	res, err := s.MigrateReport(e.ctx)
	if err != nil {
		return db.fail("migrate", err)
	}
	if len(res.Applied) == 0 {
		fmt.Fprintf(e.stdout, "outbox schema is up to date at version %d in %s\n", res.Version, db.shown)
		return nil
	}
	steps := make([]string, len(res.Applied))
	for i, m := range res.Applied {
		steps[i] = fmt.Sprintf("%04d %s", m.Version, m.Name)
	}
	noun := "migration"
	if len(steps) > 1 {
		noun = "migrations"
	}
	fmt.Fprintf(e.stdout, "applied %s %s; outbox schema at version %d in %s\n", noun, strings.Join(steps, ", "), res.Version, db.shown)
	return nil
}

// address returns the database address a command uses (local, else -db,
// else $MILLPOND_DATABASE_URL), parsed.
func address(e *env, local string) (string, dsn.Address, error) {
	raw := local
	if raw == "" {
		raw = e.dbURL
	}
	if raw == "" {
		raw = e.getenv(EnvDatabaseURL)
	}
	if raw == "" {
		return "", dsn.Address{}, usagef("no database: give -db URL or set %s", EnvDatabaseURL)
	}
	addr, err := dsn.Parse(raw)
	if err != nil {
		return "", dsn.Address{}, usagef("-db: %v", err)
	}
	return raw, addr, nil
}

// missingSQLiteFile reports whether addr names a SQLite file that does not
// exist (opening it would create an empty database).
func missingSQLiteFile(addr dsn.Address) bool {
	if addr.Dialect != dsn.SQLite {
		return false
	}
	name, _, _ := strings.Cut(addr.Path, "?")
	if name == "" || strings.Contains(name, ":memory:") {
		return false
	}
	_, err := os.Stat(name)
	return errors.Is(err, fs.ErrNotExist)
}

// openInstalled is open for commands that need the outbox schema: when it
// is not installed, it says so and how to install it, instead of letting a
// statement fail on a missing table. A SQLite file that does not exist is
// refused before it is opened: opening would leave an empty database file
// behind a mistyped path.
func openInstalled(e *env, local string, opts ...outbox.Option) (*outbox.Store, target, error) {
	if _, addr, err := address(e, local); err == nil {
		if missingSQLiteFile(addr) {
			return nil, target{addr: addr, shown: addr.String()}, fmt.Errorf("the SQLite database file of %s does not exist; check the path, or create it with `millpond migrate`", addr)
		}
	}
	s, db, err := open(e, local, opts...)
	if err != nil {
		return nil, db, err
	}
	v, err := s.SchemaVersion(e.ctx)
	if err != nil {
		s.Close()
		return nil, db, db.fail("read the schema version of", err)
	}
	if v == 0 {
		// No steps recorded by Store.Migrate: the schema may still be
		// complete, migrated with goose or golang-migrate (their own
		// bookkeeping); the catalogue tells.
		err := s.CheckSchema(e.ctx)
		switch {
		case err == nil:
			return s, db, nil
		case errors.Is(err, outbox.ErrSchemaNotInstalled):
			err = fmt.Errorf("the outbox schema is not installed in %s; run `millpond migrate` (or your migration tool)", db.shown)
		case errors.Is(err, outbox.ErrSchemaOutdated):
			err = fmt.Errorf("the outbox schema in %s is incomplete, its migrations not all applied (run them with the tool that applied the others): %w", db.shown, err)
		default:
			err = db.fail("check the schema of", err)
		}
		s.Close()
		return nil, db, err
	}
	return s, db, nil
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// jsonTime formats a time for -json output: RFC 3339 in UTC, or null.
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	v := t.UTC().Format(time.RFC3339Nano)
	return &v
}

// textTime formats a time for a table: RFC 3339 in UTC to the second, or "-".
func textTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

const statsUsage = `Usage: millpond stats [-json] [-db URL]

Count pending, processing and dead-lettered events per stream and consumer group,
the events blocked behind an earlier event of their ordering key, the ordering
keys held by a dead-lettered event (requeue it to unblock its key), and the pending
events that failed at least once (RETRYING, included in PENDING).

With -json, a JSON array with one object per stream and group:
  stream                  the stream
  group                   the consumer group ("" is the default group)
  pending                 events waiting for a claim, including delayed retries
  processing              claimed events
  dead                    dead-lettered events
  oldest_pending_age_ms   age of the oldest pending, blocked or processing event in milliseconds, 0 when none
  retrying                pending events that failed at least once (included in pending)
  blocked                 events waiting behind an earlier event of their ordering key
  held_keys               ordering keys held by a dead-lettered event
`

// statsJSON is one row of "stats -json"; the field names are stable.
type statsJSON struct {
	Stream             string `json:"stream"`
	Group              string `json:"group"`
	Pending            int64  `json:"pending"`
	Processing         int64  `json:"processing"`
	Dead               int64  `json:"dead"`
	OldestPendingAgeMS int64  `json:"oldest_pending_age_ms"`
	Retrying           int64  `json:"retrying"`
	Blocked            int64  `json:"blocked"`
	HeldKeys           int64  `json:"held_keys"`
}

func cmdStats(e *env, args []string) error {
	fs := newFlagSet(e, "stats", statsUsage)
	asJSON := fs.Bool("json", false, "print JSON (fields above)")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("stats: unexpected argument %q", pos[0])
	}
	s, db, err := openInstalled(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
	stats, err := s.Stats(e.ctx)
	if err != nil {
		return db.fail("stats of", err)
	}
	if *asJSON {
		out := make([]statsJSON, len(stats))
		for i, st := range stats {
			out[i] = statsJSON{Stream: st.Stream, Group: st.Group, Pending: st.Pending, Processing: st.Processing,
				Dead: st.Dead, OldestPendingAgeMS: st.OldestPendingAge.Milliseconds(), Retrying: st.Retrying,
				Blocked: st.Blocked, HeldKeys: st.HeldKeys}
		}
		return writeJSON(e.stdout, out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tGROUP\tPENDING\tPROCESSING\tDEAD\tOLDEST_PENDING_AGE\tBLOCKED\tHELD_KEYS\tRETRYING")
	for _, st := range stats {
		age := "-"
		if st.OldestPendingAge > 0 {
			age = st.OldestPendingAge.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\n", st.Stream, groupName(st.Group), st.Pending, st.Processing, st.Dead, age, st.Blocked, st.HeldKeys, st.Retrying)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write stats: %w", err)
	}
	if len(stats) == 0 {
		fmt.Fprintln(e.stderr, "no pending, processing or dead-lettered events")
	}
	return nil
}

// hintEmptyDeadList tells on stderr where to look when dead list found
// nothing: a stream with no registered group (a typo, say) and the streams
// that have one, or the other groups of the stream that hold dead letters
// when only one group was listed. It says nothing when it cannot tell.
func hintEmptyDeadList(e *env, s *outbox.Store, stream, group string, all bool) {
	regs, err := s.RegisteredGroups(e.ctx)
	if err != nil {
		return
	}
	var streams []string
	for _, r := range regs {
		streams = append(streams, r.Stream)
	}
	slices.Sort(streams)
	streams = slices.Compact(streams)
	if !slices.Contains(streams, stream) {
		others := "none"
		if len(streams) > 0 {
			others = strings.Join(streams, ", ")
		}
		fmt.Fprintf(e.stderr, "no consumer group is registered for stream %q (streams with groups: %s)\n", stream, others)
		return
	}
	if all {
		return
	}
	other, err := s.ListDead(e.ctx, outbox.DeadQuery{Stream: stream, AllGroups: true, Limit: 1})
	if err != nil || len(other) == 0 {
		return
	}
	fmt.Fprintf(e.stderr, "no dead letters in group %s of stream %s, but group %s has some: add -all-groups or -group NAME\n",
		groupName(group), stream, groupName(other[0].Group))
}

// groupName shows the default consumer group, stored as "", readably.
func groupName(g string) string {
	if g == "" {
		return "(default)"
	}
	return g
}

const deadListUsage = `Usage: millpond dead list -stream S [-group G | -all-groups] [-after ID] [-limit N] [-json | -show-keys] [-db URL]

List dead-lettered events of a stream, oldest first: of the default group
unless -group or -all-groups is given (a bus handler's group is its name).
When the list is empty, stderr says whether other groups of the stream hold
dead letters, or that no group is registered for the stream (a typo?). Event
keys may carry customer data, so the KEY column says (hidden) unless
-show-keys is given; payloads are never printed.

With -json, a JSON array with one object per event (event keys and payloads are never printed):
  id           the event's row id (for requeue, reroute, discard and -after)
  stream       the stream
  group        the consumer group ("" is the default group)
  kind         the event kind
  attempts     claims made
  created_at   when the event was enqueued, RFC 3339 in UTC
  last_error   the last failure text
`

// deadJSON is one row of "dead list -json"; the field names are stable. It
// has no key or payload: those are never printed.
type deadJSON struct {
	ID        int64  `json:"id"`
	Stream    string `json:"stream"`
	Group     string `json:"group"`
	Kind      string `json:"kind"`
	Attempts  int    `json:"attempts"`
	CreatedAt string `json:"created_at"`
	LastError string `json:"last_error"`
}

func cmdDeadList(e *env, args []string) error {
	fs := newFlagSet(e, "dead list", deadListUsage)
	asJSON := fs.Bool("json", false, "print JSON (fields above)")
	stream := fs.String("stream", "", "stream to list (required)")
	group := fs.String("group", "", "consumer group (default: the default group)")
	all := fs.Bool("all-groups", false, "list every consumer group of the stream")
	after := fs.Int64("after", 0, "list only ids above this one (paging)")
	limit := fs.Int("limit", 100, fmt.Sprintf("most events to list (1-%d)", outbox.MaxBatch))
	showKeys := fs.Bool("show-keys", false, "print event keys in the KEY column (hidden by default)")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("dead list: unexpected argument %q", pos[0])
	case *asJSON && *showKeys:
		return usagef("dead list: -show-keys applies to the table; -json never prints keys")
	case *stream == "":
		return usagef("dead list: -stream is required")
	case *all && *group != "":
		return usagef("dead list: -group and -all-groups exclude each other")
	case *after < 0:
		return usagef("dead list: -after must not be negative")
	case *limit < 1 || *limit > outbox.MaxBatch:
		return usagef("dead list: -limit must be 1-%d", outbox.MaxBatch)
	}
	if err := validateNames("dead list", *stream, *group); err != nil {
		return err
	}
	s, db, err := openInstalled(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
	dead, err := s.ListDead(e.ctx, outbox.DeadQuery{Stream: *stream, Group: *group, AllGroups: *all, AfterID: *after, Limit: *limit})
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidKey) {
			return usagef("dead list: %v", err)
		}
		return db.fail("list dead letters in", err)
	}
	if len(dead) == 0 && *after == 0 {
		hintEmptyDeadList(e, s, *stream, *group, *all)
	}
	if len(dead) == *limit {
		defer fmt.Fprintf(e.stderr, "more may follow: add -after %d\n", dead[len(dead)-1].ID)
	}
	if *asJSON {
		out := make([]deadJSON, len(dead))
		for i, d := range dead {
			out[i] = deadJSON{ID: d.ID, Stream: d.Stream, Group: d.Group, Kind: d.Kind, Attempts: d.Attempts,
				CreatedAt: d.CreatedAt.UTC().Format(time.RFC3339Nano), LastError: d.LastError}
		}
		return writeJSON(e.stdout, out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tGROUP\tKEY\tKIND\tATTEMPTS\tCREATED\tLAST_ERROR")
	for _, d := range dead {
		key := "(hidden)"
		if *showKeys {
			key = d.Key
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, groupName(d.Group), key, d.Kind, d.Attempts,
			d.CreatedAt.UTC().Format(time.RFC3339), safetext.Line(d.LastError))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write dead letters: %w", err)
	}
	return nil
}

func cmdDeadRequeue(e *env, args []string) error {
	return moveDead(e, args, "requeue", "requeued",
		"Make dead-lettered events of a stream pending again, with their attempts reset.",
		func(s *outbox.Store, stream string, ids []int64) (int, error) {
			return s.Requeue(e.ctx, stream, ids...)
		})
}

func cmdDeadReroute(e *env, args []string) error {
	return moveDead(e, args, "reroute", "rerouted",
		"Move dead-lettered events of a stream's default group (events no consumer group took when\nthey were enqueued) to the groups that take their kind now, as fresh pending deliveries.",
		func(s *outbox.Store, stream string, ids []int64) (int, error) {
			return s.Reroute(e.ctx, stream, ids...)
		})
}

// moveDead parses "-stream S ID..." and applies move to the ids in batches.
func moveDead(e *env, args []string, verb, done, about string, move func(*outbox.Store, string, []int64) (int, error)) error {
	fs := newFlagSet(e, "dead "+verb, "Usage: millpond dead "+verb+" -stream S ID... [-db URL]\n\n"+about+"\n")
	stream := fs.String("stream", "", "stream of the events (required)")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *stream == "" {
		return usagef("dead %s: -stream is required", verb)
	}
	if len(pos) == 0 {
		return usagef("dead %s: give at least one event id", verb)
	}
	ids, err := parseIDs("dead "+verb, pos)
	if err != nil {
		return err
	}
	if err := validateNames("dead "+verb, *stream, ""); err != nil {
		return err
	}
	s, db, err := openInstalled(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
	total := 0
	for start := 0; start < len(ids); start += outbox.MaxBatch {
		chunk := ids[start:min(start+outbox.MaxBatch, len(ids))]
		n, err := move(s, *stream, chunk)
		if err != nil {
			if errors.Is(err, outbox.ErrInvalidKey) {
				return usagef("dead %s: %v", verb, err)
			}
			return db.fail(fmt.Sprintf("%s (%d %s before the error) in", verb, total, done), err)
		}
		total += n
	}
	fmt.Fprintf(e.stdout, "%s %d of %d events\n", done, total, len(ids))
	if total == 0 {
		return nothingf("dead %s: none of the ids is a dead-lettered event of stream %s that could be %s", verb, *stream, done)
	}
	if total < len(ids) {
		fmt.Fprintf(e.stderr, "%d ids were not dead-lettered events of stream %s that could be %s, and were left alone\n", len(ids)-total, *stream, done)
	}
	return nil
}

// validateNames checks a stream and, unless empty, a consumer group before
// the database is opened: a bad name is a usage error.
func validateNames(cmd, stream, group string) error {
	if err := outbox.ValidateKey("stream", stream); err != nil {
		return usagef("%s: %v", cmd, err)
	}
	if group != "" {
		if err := outbox.ValidateKey("consumer group", group); err != nil {
			return usagef("%s: %v", cmd, err)
		}
	}
	return nil
}

// parseIDs reads positional event ids, dropping repeats.
func parseIDs(cmd string, pos []string) ([]int64, error) {
	ids := make([]int64, 0, len(pos))
	seen := map[int64]bool{}
	for _, p := range pos {
		id, err := strconv.ParseInt(p, 10, 64)
		if err != nil || id <= 0 {
			return nil, usagef("%s: %q is not an event id (a positive integer)", cmd, p)
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func cmdPurge(e *env, args []string) error {
	fs := newFlagSet(e, "purge", purgeUsage)
	var horizon retention
	fs.Var(&horizon, "older-than", "retention horizon `D`, e.g. 7d, 168h or 1d12h (required)")
	olderThan := (*time.Duration)(&horizon)
	limit := fs.Int64("limit", 0, "most rows to delete (0: all that qualify)")
	deleteOnAck := fs.Bool("delete-on-ack", false, "for stores run with outbox.WithDeleteOnAck: also delete events enqueued more than D ago that no delivery row points at (counted with the rows)")
	bulk := addBulkFlags(fs, "purge")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := bulk.check("purge"); err != nil {
		return err
	}
	horizonSet := false
	fs.Visit(func(f *flag.Flag) { horizonSet = horizonSet || f.Name == "older-than" })
	switch {
	case len(pos) > 0:
		return usagef("purge: unexpected argument %q", pos[0])
	case !horizonSet || *olderThan < 0:
		return usagef("purge: -older-than is required and must not be negative (e.g. -older-than 168h)")
	case *limit < 0:
		return usagef("purge: -limit must not be negative")
	}
	var opts []outbox.Option
	if *deleteOnAck {
		opts = append(opts, outbox.WithDeleteOnAck())
	}
	s, db, err := openInstalled(e, *dbFlag, opts...)
	if err != nil {
		return err
	}
	defer s.Close()
	what := "delivered events"
	if *deleteOnAck {
		what = "delivered events and events no delivery row points at"
	}
	if !bulk.yes {
		// Count and confirm first. -yes (a scheduled purge) skips the
		// count, a read of every purgeable row, and purges as before.
		n, err := s.CountPurgeable(e.ctx, *olderThan)
		if err != nil {
			return db.fail("count the events to purge in", err)
		}
		if *limit > 0 {
			n = min(n, *limit)
		}
		if n == 0 {
			fmt.Fprintf(e.stdout, "purged 0 %s older than %s\n", what, *olderThan)
			return nil
		}
		if err := confirmBulk(e, bulk, "purge", "purged", strconv.FormatInt(n, 10), fmt.Sprintf("these %d events", n),
			fmt.Sprintf("would purge %d %s older than %s", n, what, *olderThan)); err != nil {
			return err
		}
		// At most what was counted and confirmed: events delivered
		// since wait for the next purge.
		*limit = n
	}
	var total int64
	for *limit == 0 || total < *limit {
		chunk := int64(purgeChunk)
		if *limit > 0 {
			chunk = min(chunk, *limit-total)
		}
		n, err := s.Purge(e.ctx, *olderThan, int(chunk))
		if err != nil {
			return db.fail(fmt.Sprintf("purge (%d deleted before the error) of", total), err)
		}
		total += n
		if n < chunk {
			break
		}
	}
	if *deleteOnAck {
		fmt.Fprintf(e.stdout, "purged %d delivered events and events no delivery row points at, older than %s\n", total, *olderThan)
		return nil
	}
	fmt.Fprintf(e.stdout, "purged %d delivered events older than %s\n", total, *olderThan)
	return nil
}
