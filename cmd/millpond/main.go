// Command millpond administers a millpond outbox database: it installs or
// removes the schema, shows backlog statistics, lists and requeues
// dead-lettered events, and purges delivered events past their retention.
//
// Usage:
//
//	millpond [-db URL] <command> [flags]
//
//	millpond migrate [-down -yes]
//	millpond stats
//	millpond dead list -stream S [-group G | -all-groups] [-after ID] [-limit N]
//	millpond dead requeue -stream S ID...
//	millpond dead reroute -stream S ID...
//	millpond purge -older-than 168h [-limit N]
//
// The database comes from -db (before or after the command) or from the
// MILLPOND_DATABASE_URL environment variable: postgres://, mysql://,
// sqlite:path or a PostgreSQL key=value string. Passwords are never printed. The exit code is 0 on success,
// 1 when the command failed and 2 for a usage error.
package main

import (
	"github.com/millpond/millpond/outbox/anydb"

	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/outbox"
)

// EnvDatabaseURL names the environment variable read when -db is not given.
const EnvDatabaseURL = "MILLPOND_DATABASE_URL"

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// purgeChunk is how many rows one Purge statement deletes at most, so a
// large purge never holds one long transaction.
const purgeChunk = 10_000

const usageText = `Usage: millpond [-db URL] <command> [flags]

Commands:
  migrate [-down -yes]                  install or upgrade the outbox schema (-down -yes removes it and every event)
  stats                                 count pending, processing and dead-lettered events per stream and group
  dead list -stream S [-group G | -all-groups] [-after ID] [-limit N]
                                        list dead-lettered events, oldest first
  dead requeue -stream S ID...          make dead-lettered events pending again, attempts reset
  dead reroute -stream S ID...          move unrouted dead letters to the groups that take their kind now
  purge -older-than D [-limit N]        delete events delivered more than D ago (e.g. 168h)

The database is -db URL or $` + EnvDatabaseURL + `:
  postgres://user:pass@host:5432/db?sslmode=disable
  host=127.0.0.1 user=app password=… dbname=app   (PostgreSQL key=value)
  mysql://user:pass@host:3306/db
  sqlite:path/to/file.db
Passwords are never printed.

Run "millpond <command> -h" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// usageError is a mistake in the command line: it exits with code 2.
type usageError struct {
	msg     string
	printed bool // the flag package already printed msg and the usage
}

func (e *usageError) Error() string { return e.msg }

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
}

// run executes the command line args (without the program name) and
// returns the process exit code. It is main without the process: tests call
// it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	e := &env{ctx: ctx, stdout: stdout, stderr: stderr, getenv: getenv}
	err := dispatch(e, args)
	var uerr *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
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
		if len(rest) == 0 {
			return usagef("dead: want a subcommand: list, requeue or reroute")
		}
		switch rest[0] {
		case "list":
			return cmdDeadList(e, rest[1:])
		case "requeue":
			return cmdDeadRequeue(e, rest[1:])
		case "reroute":
			return cmdDeadReroute(e, rest[1:])
		default:
			return usagef("dead: unknown subcommand %q (want list, requeue or reroute)", rest[0])
		}
	case "purge":
		return cmdPurge(e, rest)
	default:
		return usagef("unknown command %q", cmd)
	}
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
func open(e *env, local string) (*outbox.Store, target, error) {
	raw := local
	if raw == "" {
		raw = e.dbURL
	}
	if raw == "" {
		raw = e.getenv(EnvDatabaseURL)
	}
	if raw == "" {
		return nil, target{}, usagef("no database: give -db URL or set %s", EnvDatabaseURL)
	}
	addr, err := dsn.Parse(raw)
	if err != nil {
		return nil, target{}, usagef("-db: %v", err)
	}
	t := target{addr: addr, shown: addr.String()}
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	s, err := anydb.Open(ctx, raw, outbox.WithoutListen())
	if err != nil {
		// Open's error names the redacted address already.
		return nil, t, errors.New(addr.Scrub(err.Error()))
	}
	return s, t, nil
}

func cmdMigrate(e *env, args []string) error {
	fs := newFlagSet(e, "migrate", "Usage: millpond migrate [-down -yes] [-db URL]\n\nInstall or upgrade the outbox schema; with -down remove it and every event in it.\n")
	down := fs.Bool("down", false, "revert every migration: drops the outbox tables and all events (needs -yes)")
	yes := fs.Bool("yes", false, "confirm -down")
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
	s, db, err := open(e, *dbFlag)
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
	if err := s.Migrate(e.ctx); err != nil {
		return db.fail("migrate", err)
	}
	fmt.Fprintf(e.stdout, "outbox schema is up to date in %s\n", db.shown)
	return nil
}

func cmdStats(e *env, args []string) error {
	fs := newFlagSet(e, "stats", "Usage: millpond stats [-db URL]\n\nCount pending, processing and dead-lettered events per stream and consumer group,\nthe events blocked behind an earlier event of their ordering key, and the ordering\nkeys held by a dead-lettered event (requeue it to unblock its key).\n")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("stats: unexpected argument %q", pos[0])
	}
	s, db, err := open(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
	stats, err := s.Stats(e.ctx)
	if err != nil {
		return db.fail("stats of", err)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tGROUP\tPENDING\tPROCESSING\tDEAD\tOLDEST_PENDING_AGE\tBLOCKED\tHELD_KEYS")
	for _, st := range stats {
		age := "-"
		if st.OldestPendingAge > 0 {
			age = st.OldestPendingAge.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%d\n", st.Stream, groupName(st.Group), st.Pending, st.Processing, st.Dead, age, st.Blocked, st.HeldKeys)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write stats: %w", err)
	}
	if len(stats) == 0 {
		fmt.Fprintln(e.stderr, "no pending, processing or dead-lettered events")
	}
	return nil
}

// groupName shows the default consumer group, stored as "", readably.
func groupName(g string) string {
	if g == "" {
		return "(default)"
	}
	return g
}

func cmdDeadList(e *env, args []string) error {
	fs := newFlagSet(e, "dead list", "Usage: millpond dead list -stream S [-group G | -all-groups] [-after ID] [-limit N] [-db URL]\n\nList dead-lettered events of a stream, oldest first.\n")
	stream := fs.String("stream", "", "stream to list (required)")
	group := fs.String("group", "", "consumer group (default: the default group)")
	all := fs.Bool("all-groups", false, "list every consumer group of the stream")
	after := fs.Int64("after", 0, "list only ids above this one (paging)")
	limit := fs.Int("limit", 100, fmt.Sprintf("most events to list (1-%d)", outbox.MaxBatch))
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("dead list: unexpected argument %q", pos[0])
	case *stream == "":
		return usagef("dead list: -stream is required")
	case *all && *group != "":
		return usagef("dead list: -group and -all-groups exclude each other")
	case *after < 0:
		return usagef("dead list: -after must not be negative")
	case *limit < 1 || *limit > outbox.MaxBatch:
		return usagef("dead list: -limit must be 1-%d", outbox.MaxBatch)
	}
	s, db, err := open(e, *dbFlag)
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
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tGROUP\tKEY\tKIND\tATTEMPTS\tCREATED\tLAST_ERROR")
	for _, d := range dead {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, groupName(d.Group), d.Key, d.Kind, d.Attempts,
			d.CreatedAt.UTC().Format(time.RFC3339), d.LastError)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write dead letters: %w", err)
	}
	if len(dead) == *limit {
		fmt.Fprintf(e.stderr, "more may follow: add -after %d\n", dead[len(dead)-1].ID)
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
	ids := make([]int64, 0, len(pos))
	seen := map[int64]bool{}
	for _, p := range pos {
		id, err := strconv.ParseInt(p, 10, 64)
		if err != nil || id <= 0 {
			return usagef("dead %s: %q is not an event id (a positive integer)", verb, p)
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	s, db, err := open(e, *dbFlag)
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
	if total < len(ids) {
		fmt.Fprintf(e.stderr, "%d ids were not dead-lettered events of stream %s that could be %s, and were left alone\n", len(ids)-total, *stream, done)
	}
	return nil
}

func cmdPurge(e *env, args []string) error {
	fs := newFlagSet(e, "purge", "Usage: millpond purge -older-than D [-limit N] [-db URL]\n\nDelete events delivered more than D ago (e.g. 168h). Their keys may then be enqueued again.\n")
	olderThan := fs.Duration("older-than", 0, "retention horizon, e.g. 168h (required)")
	limit := fs.Int64("limit", 0, "most rows to delete (0: all that qualify)")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
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
	s, db, err := open(e, *dbFlag)
	if err != nil {
		return err
	}
	defer s.Close()
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
	fmt.Fprintf(e.stdout, "purged %d delivered events older than %s\n", total, *olderThan)
	return nil
}
