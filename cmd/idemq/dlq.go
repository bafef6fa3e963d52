package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/idemq/idemq/outbox"
)

func dlqFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "inbox", Usage: "the inbox's dead letters (consumers) instead of the outbox's (relay)"},
		&cli.BoolFlag{Name: "conflicts", Usage: "with --inbox: messages refused because their key was applied with another payload"},
		&cli.StringFlag{Name: "destination", Usage: "outbox destination, exactly"},
		&cli.StringFlag{Name: "destination-prefix", Usage: "outbox destinations starting with this"},
		&cli.StringFlag{Name: "scope", Usage: "inbox scope (consumer name), exactly"},
		&cli.StringFlag{Name: "key", Usage: "outbox ordering key, or inbox key, exactly"},
		&cli.StringSliceFlag{Name: "id", Usage: "outbox message id, or with --inbox inbox key (the message id) (repeatable)"},
		&cli.DurationFlag{Name: "older-than", Usage: "dead letters that failed longer ago than this"},
		&cli.DurationFlag{Name: "newer-than", Usage: "dead letters that failed within this"},
		&cli.IntFlag{Name: "limit", Usage: "at most this many (list: default 100; replay and purge: no limit)"},
	}
}

// moveFlags are the flags of replay and, with purge, of purge.
func moveFlags(purge bool) []cli.Flag {
	flags := append(dlqFlags(),
		&cli.BoolFlag{Name: "all", Usage: "every dead letter (purge: required when no filter is given)"},
		&cli.BoolFlag{Name: "dry-run", Usage: "print what would change, and change nothing"})
	if purge {
		flags = append(flags, &cli.BoolFlag{Name: "yes", Usage: "purge without asking, also on a terminal"})
	}
	return flags
}

func dlqCommand() *cli.Command {
	return &cli.Command{
		Name:  "dlq",
		Usage: "list, show, replay and purge dead letters",
		Description: "Outbox dead letters are messages the relay gave up on; replay puts them back in the outbox (same id, same\n" +
			"place in their key's order). With --inbox, the consumers' dead letters: replay releases them so that the\n" +
			"next delivery of the message is applied again; purge forgets them. --inbox --conflicts does the same for\n" +
			"messages refused because their key was applied with another payload. Replay and purge exit 5 when a\n" +
			"--destination, --scope, --key or --id matches no dead letter, and then change nothing. Purge needs a filter or --all;\n" +
			"on a terminal it prints the count and the filter and asks first (--yes does not ask). --dry-run prints what\n" +
			"would be replayed or purged and changes nothing. Ages (--older-than, --newer-than) must be positive.",
		Action: groupAction,
		Commands: []*cli.Command{
			{Name: "list", Usage: "list dead letters, oldest first", Flags: dlqFlags(), Action: dlqList},
			{Name: "show", Usage: "show one dead letter with its payload", ArgsUsage: "ID (outbox) | SCOPE KEY (--inbox)",
				Flags: dlqFlags(), Action: dlqShow},
			{Name: "replay", Usage: "put dead letters back for another attempt", Flags: moveFlags(false), Action: dlqMove(false)},
			{Name: "purge", Usage: "delete dead letters (a filter or --all is required)", Flags: moveFlags(true), Action: dlqMove(true)},
		},
	}
}

// outboxFilter reads the filter flags for outbox dead letters.
func outboxFilter(cmd *cli.Command) (outbox.DeadFilter, error) {
	for _, f := range []string{"scope", "conflicts"} {
		if cmd.IsSet(f) {
			return outbox.DeadFilter{}, usageError("--%s selects inbox dead letters: add --inbox", f)
		}
	}
	f := outbox.DeadFilter{
		Destination:       cmd.String("destination"),
		DestinationPrefix: cmd.String("destination-prefix"),
		Key:               cmd.String("key"),
	}
	var err error
	if f.Limit, err = limitFlag(cmd); err != nil {
		return f, err
	}
	for _, s := range cmd.StringSlice("id") {
		id, err := uuid.Parse(s)
		if err != nil {
			return f, usageError("--id %q: %v", s, err)
		}
		f.IDs = append(f.IDs, id)
	}
	f.FailedBefore, f.FailedAfter, err = failedWindow(cmd)
	return f, err
}

// deadLetterJSON is an outbox dead letter as the dlq commands print it:
// the payload in base64 and, when it is valid UTF-8, as text too.
type deadLetterJSON struct {
	ID          uuid.UUID         `json:"id"`
	Destination string            `json:"destination"`
	Key         string            `json:"key"`
	Headers     map[string]string `json:"headers,omitempty"`
	Payload     []byte            `json:"payload"`
	PayloadText *string           `json:"payload_text,omitempty"`
	Attempts    int               `json:"attempts"`
	LastError   string            `json:"last_error"`
	CreatedAt   time.Time         `json:"created_at"`
	FailedAt    time.Time         `json:"failed_at"`
}

func dlqList(ctx context.Context, cmd *cli.Command) error {
	set, done, err := openDeadSet(ctx, cmd)
	if err != nil {
		return err
	}
	defer done()
	rows, human, n, err := set.list(ctx)
	if err != nil {
		return err
	}
	return output(cmd, rows, func(t *table) {
		human(t)
		t.note("%d %s", n, set.noun())
	})
}

func jsonDead(dead []outbox.DeadLetter) []deadLetterJSON {
	out := make([]deadLetterJSON, len(dead))
	for i, d := range dead {
		out[i] = deadLetterJSON{ID: d.ID, Destination: d.Destination, Key: d.Key, Headers: d.Headers, Payload: d.Payload,
			Attempts: d.Attempts, LastError: d.LastError, CreatedAt: d.CreatedAt, FailedAt: d.FailedAt}
		if utf8.Valid(d.Payload) {
			out[i].PayloadText = new(string(d.Payload))
		}
	}
	return out
}

func dlqShow(ctx context.Context, cmd *cli.Command) error {
	if cmd.Bool("inbox") {
		return inboxDeadShow(ctx, cmd)
	}
	if cmd.Args().Len() != 1 {
		return usageError("dlq show: want one message id")
	}
	id, err := uuid.Parse(cmd.Args().First())
	if err != nil {
		return usageError("dlq show %q: %v", cmd.Args().First(), err)
	}
	ob, done, err := openOutbox(ctx, cmd)
	if err != nil {
		return err
	}
	defer done()
	dead, err := ob.DeadLetters(ctx, outbox.DeadFilter{IDs: []uuid.UUID{id}})
	if err != nil {
		return err
	}
	if len(dead) == 0 {
		return withCode(exitNotFound, "no outbox dead letter with id %s", id)
	}
	d := dead[0]
	return output(cmd, jsonDead(dead)[0], func(t *table) {
		t.row("id", d.ID.String())
		t.row("destination", d.Destination)
		t.row("key", d.Key)
		t.row("attempts", fmt.Sprint(d.Attempts))
		t.row("created", timestamp(d.CreatedAt))
		t.row("failed", timestamp(d.FailedAt))
		t.row("error", d.LastError)
		for name, v := range d.Headers {
			t.row("header "+name, v)
		}
		t.row("payload", payloadText(d.Payload))
	})
}

// filterFlags are the dlq flags that narrow a selection; purge without any
// of them needs --all.
var filterFlags = []string{"destination", "destination-prefix", "scope", "key", "id", "older-than", "newer-than"}

// dlqMove replays (purge false) or purges the selected dead letters. It
// changes nothing when an --id names no dead letter; with --dry-run it
// lists what would be moved; a purge asks first on a terminal.
func dlqMove(purge bool) cli.ActionFunc {
	verb := map[bool]string{false: "replayed", true: "purged"}[purge]
	return func(ctx context.Context, cmd *cli.Command) error {
		filtered := slices.ContainsFunc(filterFlags, cmd.IsSet)
		switch {
		case purge && !filtered && !cmd.Bool("all"):
			return usageError("dlq purge without a filter would delete every dead letter: give a filter (--%s) or --all",
				strings.Join(filterFlags, ", --"))
		case cmd.Bool("all") && filtered:
			return usageError("--all selects every dead letter: drop it or the filters")
		}
		set, done, err := openDeadSet(ctx, cmd)
		if err != nil {
			return err
		}
		defer done()
		if err := set.checkIDs(ctx); err != nil {
			return err
		}
		// Count in a transaction that is rolled back: the count is what
		// the move would do, and nothing stays locked while a person reads.
		var n int64
		countedAt, err := set.rehearse(ctx, func(tx pgx.Tx) (err error) {
			n, err = set.move(ctx, tx, purge)
			return err
		})
		if err != nil {
			return err
		}
		if n == 0 && slices.ContainsFunc([]string{"destination", "scope", "key", "id"}, cmd.IsSet) {
			return withCode(exitNotFound, "no %s %s; nothing changed", set.noun(), describeFilter(cmd))
		}
		if cmd.Bool("dry-run") {
			return set.dryRun(ctx, verb, n)
		}
		if purge && n > 0 && !cmd.Bool("yes") && term.IsTerminal(int(os.Stdin.Fd())) {
			if !confirm(cmd, fmt.Sprintf("purge %d %s %s?", n, set.noun(), describeFilter(cmd))) {
				return withCode(exitFailure, "nothing purged: not confirmed (--yes skips the question)")
			}
			// Only what was counted: dead letters that failed since are
			// left for another look.
			set.failedBefore(countedAt)
		}
		err = pgx.BeginFunc(ctx, set.pool, func(tx pgx.Tx) (err error) {
			n, err = set.move(ctx, tx, purge)
			return err
		})
		if err != nil {
			return err
		}
		return output(cmd, map[string]int64{verb: n}, func(t *table) { t.note("%s %d %s", verb, n, set.noun()) })
	}
}

// describeFilter says in words which dead letters the flags select.
func describeFilter(cmd *cli.Command) string {
	var parts []string
	for _, name := range filterFlags {
		if !cmd.IsSet(name) {
			continue
		}
		switch name {
		case "id":
			parts = append(parts, "--id "+strings.Join(cmd.StringSlice(name), " --id "))
		case "older-than", "newer-than":
			parts = append(parts, "--"+name+" "+cmd.Duration(name).String())
		default:
			parts = append(parts, fmt.Sprintf("--%s %q", name, cmd.String(name)))
		}
	}
	if limit := cmd.Int("limit"); limit > 0 {
		parts = append(parts, fmt.Sprintf("--limit %d", limit))
	}
	if len(parts) == 0 {
		return "(all of them)"
	}
	return "matching " + strings.Join(parts, " ")
}

// confirm asks question on stderr and reads the answer from stdin: true
// for y or yes.
func confirm(cmd *cli.Command, question string) bool {
	fmt.Fprintf(cmd.Root().ErrWriter, "%s [y/N] ", question)
	answer, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true
	}
	return false
}

// limitFlag reads --limit. Zero means no limit to the stores (or 100 for
// a list), so an explicit --limit 0 is refused rather than taken as "all".
func limitFlag(cmd *cli.Command) (int, error) {
	if n := cmd.Int("limit"); cmd.IsSet("limit") && n <= 0 {
		return 0, usageError("--limit %d: want a positive number (leave it out for no limit, or 100 for list)", n)
	}
	return cmd.Int("limit"), nil
}

// failedWindow reads --older-than and --newer-than as the times dead
// letters failed before and after. An age must be positive: a negative one
// used to be dropped, which selected every dead letter.
func failedWindow(cmd *cli.Command) (before, after time.Time, err error) {
	now := time.Now()
	for name, at := range map[string]*time.Time{"older-than": &before, "newer-than": &after} {
		if !cmd.IsSet(name) {
			continue
		}
		d := cmd.Duration(name)
		if d <= 0 {
			return before, after, usageError("--%s %v: want a positive age, e.g. 24h", name, d)
		}
		*at = now.Add(-d)
	}
	return before, after, nil
}

// openOutbox connects and returns the outbox; done closes the pool.
func openOutbox(ctx context.Context, cmd *cli.Command) (*outbox.Outbox, func(), error) {
	pool, err := connect(ctx, cmd)
	if err != nil {
		return nil, nil, err
	}
	ob, _, err := stores(cmd, pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return ob, pool.Close, nil
}
