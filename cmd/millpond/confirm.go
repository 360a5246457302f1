package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// bulkFlags are the flags of a command that deletes many events at once
// (dead discard -kind/-all, groups unregister -discard, purge).
type bulkFlags struct {
	yes    bool
	dryRun bool
}

func addBulkFlags(fs *flag.FlagSet, verb string) *bulkFlags {
	b := &bulkFlags{}
	fs.BoolVar(&b.yes, "yes", false, "confirm: "+verb+" without asking (for scripts)")
	fs.BoolVar(&b.dryRun, "dry-run", false, "only count what would be deleted; delete nothing")
	return b
}

func (b *bulkFlags) check(cmd string) error {
	if b.yes && b.dryRun {
		return usagef("%s: -yes and -dry-run exclude each other", cmd)
	}
	return nil
}

// notConfirmedError is a bulk deletion that was not confirmed: it exits
// with code 2, like a usage error, and nothing was deleted.
type notConfirmedError struct{ msg string }

func (e *notConfirmedError) Error() string { return e.msg }

// errDryRun stops a command after a dry run's count: it exits with code 0.
var errDryRun = errors.New("dry run")

// confirmBulk is asked before a bulk deletion of some events. Unless -yes
// is given (a script's output stays as it was) it prints summary, what the
// deletion would delete and how many, on stdout. With -dry-run it then
// says that nothing was deleted and returns errDryRun; with -yes it
// returns nil. On
// a terminal it asks the operator to type answer (a group or stream name,
// or the count) and returns nil only when they do; otherwise the deletion
// is not confirmed and the error says how to confirm it.
func confirmBulk(e *env, b *bulkFlags, cmd, verb, answer, what, summary string) error {
	if !b.yes {
		fmt.Fprintln(e.stdout, summary)
	}
	switch {
	case b.dryRun:
		fmt.Fprintf(e.stderr, "dry run: nothing was %s\n", verb)
		return errDryRun
	case b.yes:
		return nil
	}
	unconfirmed := &notConfirmedError{msg: fmt.Sprintf("%s: not confirmed, nothing was %s: add -yes to delete %s for good (or -dry-run to only count)", cmd, verb, what)}
	if !e.interactive || e.stdin == nil {
		return unconfirmed
	}
	fmt.Fprintf(e.stderr, "This deletes %s for good. Type %q to confirm: ", what, answer)
	// Read aside, so that Ctrl-C (which main turns into ctx's
	// cancellation) ends the wait instead of being swallowed by it.
	type reply struct {
		line string
		err  error
	}
	got := make(chan reply, 1)
	go func() {
		line, err := bufio.NewReader(e.stdin).ReadString('\n')
		got <- reply{line, err}
	}()
	var line string
	select {
	case <-e.ctx.Done():
		fmt.Fprintln(e.stderr)
		return &notConfirmedError{msg: fmt.Sprintf("%s: interrupted; nothing was %s", cmd, verb)}
	case r := <-got:
		if r.err != nil && !errors.Is(r.err, io.EOF) {
			return fmt.Errorf("%s: read the confirmation: %w", cmd, r.err)
		}
		if r.err != nil && r.line == "" {
			// No answer at all: stdin is /dev/null (a character device,
			// so taken for a terminal, as under cron) or was closed.
			fmt.Fprintln(e.stderr)
			return unconfirmed
		}
		line = r.line
	}
	if strings.TrimSpace(line) != answer {
		return &notConfirmedError{msg: fmt.Sprintf("%s: the answer was not %q; nothing was %s", cmd, answer, verb)}
	}
	return nil
}
