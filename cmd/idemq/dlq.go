package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/idemq/idemq/outbox"
)

// dlqOptions are the flags of a dlq command, typed: the parser writes
// each into its field (Destination), the flags' validators refuse a
// non-positive age or limit and a --since in the future as they are
// parsed, and validate checks how they combine. An empty value is refused
// for every flag (refuseEmpty), so a zero field is a flag not given.
type dlqOptions struct {
	inbox, conflicts               bool
	destination, destinationPrefix string
	scope, key, keyPrefix          string
	group, class                   string
	since                          time.Time
	ids                            []string
	olderThan, newerThan           time.Duration
	limit                          int
	all, dryRun, yes               bool
}

// positive is the validator of a flag that must be above zero when given.
func positive[T int | time.Duration](flag, what string) func(T) error {
	return func(v T) error {
		if v <= 0 {
			return fmt.Errorf("--%s %v: want a positive %s", flag, v, what)
		}
		return nil
	}
}

func dlqFlags(o *dlqOptions) []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "inbox", Usage: "the inbox's dead letters (consumers) instead of the outbox's (relay)", Destination: &o.inbox},
		&cli.BoolFlag{Name: "conflicts", Usage: "with --inbox: messages refused because their key was applied with another payload", Destination: &o.conflicts},
		&cli.StringFlag{Name: "destination", Usage: "outbox destination, exactly", Destination: &o.destination},
		&cli.StringFlag{Name: "destination-prefix", Usage: "outbox destinations starting with this", Destination: &o.destinationPrefix},
		&cli.StringFlag{Name: "scope", Usage: "inbox scope (consumer name), exactly", Destination: &o.scope},
		&cli.StringFlag{Name: "key", Usage: "outbox ordering key, or inbox key, exactly", Destination: &o.key},
		&cli.StringFlag{Name: "key-prefix", Usage: "outbox ordering keys starting with this", Destination: &o.keyPrefix},
		&cli.StringFlag{Name: "group", Usage: "the dead letters of one group (its id, as dlq groups shows it: 6 hex digits or more)", Destination: &o.group},
		&cli.StringFlag{Name: "class", Usage: "dead letters of this error class exactly (as dlq groups shows it)", Destination: &o.class},
		&cli.TimestampFlag{Name: "since", Usage: "dead letters that failed at or after this time (RFC 3339)", Destination: &o.since,
			Config: cli.TimestampConfig{Layouts: []string{time.RFC3339, time.DateTime, time.DateOnly}},
			Validator: func(t time.Time) error {
				if t.After(time.Now()) {
					return fmt.Errorf("--since %s is in the future", timestamp(t))
				}
				return nil
			}},
		&cli.StringSliceFlag{Name: "id", Usage: "outbox message id, or with --inbox inbox key (the message id) (repeatable)", Destination: &o.ids},
		// A negative or zero age used to be dropped, which selected every
		// dead letter; --limit 0 would be no limit.
		&cli.DurationFlag{Name: "older-than", Usage: "dead letters that failed longer ago than this", Destination: &o.olderThan,
			Validator: positive[time.Duration]("older-than", "age, e.g. 24h")},
		&cli.DurationFlag{Name: "newer-than", Usage: "dead letters that failed within this", Destination: &o.newerThan,
			Validator: positive[time.Duration]("newer-than", "age, e.g. 24h")},
		&cli.IntFlag{Name: "limit", Usage: "at most this many (list: default 100; replay and purge: no limit)", Destination: &o.limit,
			Validator: positive[int]("limit", "number (leave it out for no limit, or 100 for list)")},
	}
}

// moveFlags are the flags of replay and, with purge, of purge.
func moveFlags(o *dlqOptions, purge bool) []cli.Flag {
	flags := append(dlqFlags(o),
		&cli.BoolFlag{Name: "all", Usage: "every dead letter (purge: required when no filter is given)", Destination: &o.all},
		&cli.BoolFlag{Name: "dry-run", Usage: "print what would change, and change nothing", Destination: &o.dryRun})
	if purge {
		flags = append(flags, &cli.BoolFlag{Name: "yes", Usage: "purge without asking, also on a terminal", Destination: &o.yes})
	}
	return flags
}

// dlqAction is a dlq command's action on its options.
type dlqAction func(context.Context, *cli.Command, *dlqOptions) error

// dlqSub returns the dlq subcommand name, whose flags (moveFlags for
// replay and purge) are read into options of its own.
func dlqSub(name, usage, argsUsage string, flags func(*dlqOptions) []cli.Flag, action dlqAction) *cli.Command {
	o := &dlqOptions{}
	return &cli.Command{Name: name, Usage: usage, ArgsUsage: argsUsage, Flags: flags(o),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := o.validate(); err != nil {
				return err
			}
			return action(ctx, cmd, o)
		}}
}

// validate refuses flags that do not combine: the outbox's with --inbox,
// the inbox's without it, two names of one thing.
func (o *dlqOptions) validate() error {
	type flag struct {
		name string
		set  bool
	}
	outboxOnly := []flag{{"destination", o.destination != ""}, {"destination-prefix", o.destinationPrefix != ""}, {"key-prefix", o.keyPrefix != ""}}
	inboxOnly := []flag{{"scope", o.scope != ""}, {"conflicts", o.conflicts}}
	for _, f := range outboxOnly {
		if o.inbox && f.set {
			return usageError("--%s selects outbox dead letters: drop --inbox", f.name)
		}
	}
	for _, f := range inboxOnly {
		if !o.inbox && f.set {
			return usageError("--%s selects inbox dead letters: add --inbox", f.name)
		}
	}
	switch {
	case o.inbox && len(o.ids) > 0 && o.key != "":
		// With --inbox both name the inbox key (the message id).
		return usageError("--id and --key both name inbox keys: give one of them")
	case o.group != "" && o.class != "":
		return usageError("--group and --class both name a class: give one")
	case o.group != "" && o.conflicts:
		return usageError("--group selects dead letters: conflicts have no error class")
	case o.group != "" && len(strings.TrimSpace(o.group)) < 6:
		return usageError("--group %q: give at least 6 hex digits of the id dlq groups shows", o.group)
	}
	return nil
}

// filters lists the filter flags given, as --name value; purge without
// any of them needs --all.
func (o *dlqOptions) filters() []string {
	var parts []string
	add := func(name string, set bool, value string) {
		if set {
			parts = append(parts, "--"+name+" "+value)
		}
	}
	add("destination", o.destination != "", strconv.Quote(o.destination))
	add("destination-prefix", o.destinationPrefix != "", strconv.Quote(o.destinationPrefix))
	add("scope", o.scope != "", strconv.Quote(o.scope))
	add("key", o.key != "", strconv.Quote(o.key))
	add("key-prefix", o.keyPrefix != "", strconv.Quote(o.keyPrefix))
	add("group", o.group != "", strconv.Quote(o.group))
	add("class", o.class != "", strconv.Quote(o.class))
	for _, id := range o.ids {
		add("id", true, id)
	}
	add("older-than", o.olderThan > 0, o.olderThan.String())
	add("newer-than", o.newerThan > 0, o.newerThan.String())
	add("since", !o.since.IsZero(), timestamp(o.since))
	return parts
}

// named reports whether a flag that names dead letters (rather than
// narrowing them) is given: a move that finds none of them exits 5.
func (o *dlqOptions) named() bool {
	return o.destination != "" || o.scope != "" || o.key != "" || len(o.ids) > 0 || o.group != ""
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
			"would be replayed or purged and changes nothing. Ages (--older-than, --newer-than) must be positive.\n" +
			"dlq groups groups dead letters by error class (the error text with ids, numbers, addresses and times\n" +
			"replaced by placeholders) and destination (--inbox: scope); --group ID then selects one group in list,\n" +
			"replay and purge, and --since T everything that failed since T. Replays and purges of outbox dead letters\n" +
			"are written to the outbox's audit log.",
		Action: groupAction,
		Commands: []*cli.Command{
			dlqSub("list", "list dead letters, oldest first", "", dlqFlags, dlqList),
			dlqSub("show", "show one dead letter with its payload", "ID (outbox) | SCOPE KEY (--inbox)", dlqFlags, dlqShow),
			dlqSub("replay", "put dead letters back for another attempt", "", func(o *dlqOptions) []cli.Flag { return moveFlags(o, false) }, dlqMove(false)),
			dlqSub("purge", "delete dead letters (a filter or --all is required)", "", func(o *dlqOptions) []cli.Flag { return moveFlags(o, true) }, dlqMove(true)),
			dlqSub("groups", "group dead letters by error class and destination (--inbox: scope), largest first", "", dlqFlags, dlqGroups),
			dlqSub("classify", "store the error class of dead letters written before idemq stored classes", "", dlqFlags, dlqClassify),
		},
	}
}

// outboxFilter is the filter the flags select among outbox dead letters.
func (o *dlqOptions) outboxFilter() (outbox.DeadFilter, error) {
	f := outbox.DeadFilter{Destination: o.destination, DestinationPrefix: o.destinationPrefix, Key: o.key, KeyPrefix: o.keyPrefix,
		ErrorClass: o.class, Limit: o.limit}
	for _, s := range o.ids {
		id, err := uuid.Parse(s)
		if err != nil {
			return f, usageError("--id %q: %v", s, err)
		}
		f.IDs = append(f.IDs, id)
	}
	f.FailedBefore, f.FailedAfter = o.failedWindow()
	// The command refuses empty values and shows what it selects (purge
	// asks, and wants --all for everything): a filter with nothing set
	// means every dead letter.
	f.All = true
	return f, nil
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
	ErrorClass  string            `json:"error_class"`
	CreatedAt   time.Time         `json:"created_at"`
	FailedAt    time.Time         `json:"failed_at"`
}

func dlqList(ctx context.Context, cmd *cli.Command, o *dlqOptions) error {
	set, done, err := openDeadSet(ctx, cmd, o)
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
			Attempts: d.Attempts, LastError: d.LastError, ErrorClass: d.ErrorClass, CreatedAt: d.CreatedAt, FailedAt: d.FailedAt}
		if utf8.Valid(d.Payload) {
			out[i].PayloadText = new(string(d.Payload))
		}
	}
	return out
}

func dlqShow(ctx context.Context, cmd *cli.Command, o *dlqOptions) error {
	if o.inbox {
		return inboxDeadShow(ctx, cmd, o)
	}
	if cmd.Args().Len() != 1 {
		return usageError("dlq show: want one message id")
	}
	id, err := uuid.Parse(cmd.Args().First())
	if err != nil {
		return usageError("dlq show %q: %v", cmd.Args().First(), err)
	}
	set, done, err := openDeadSet(ctx, cmd, o)
	if err != nil {
		return err
	}
	defer done()
	dead, err := set.ob.DeadLetters(ctx, outbox.DeadFilter{IDs: []uuid.UUID{id}})
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
		t.row("class", d.ErrorClass)
		for name, v := range d.Headers {
			t.row("header "+name, v)
		}
		t.row("payload", payloadText(d.Payload))
	})
}

// dlqMove replays (purge false) or purges the selected dead letters. It
// changes nothing when an --id names no dead letter; with --dry-run it
// lists what would be moved; a purge asks first on a terminal.
func dlqMove(purge bool) dlqAction {
	verb := map[bool]string{false: "replayed", true: "purged"}[purge]
	return func(ctx context.Context, cmd *cli.Command, o *dlqOptions) error {
		filtered := len(o.filters()) > 0
		switch {
		case purge && !filtered && !o.all:
			return usageError("dlq purge without a filter would delete every dead letter: give a filter (--%s) or --all",
				"destination, --destination-prefix, --scope, --key, --key-prefix, --group, --class, --id, --older-than, --newer-than, --since")
		case o.all && filtered:
			return usageError("--all selects every dead letter: drop it or the filters")
		}
		set, done, err := openDeadSet(ctx, cmd, o)
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
		if n == 0 && o.named() {
			return withCode(exitNotFound, "no %s %s; nothing changed", set.noun(), o.describe())
		}
		if o.dryRun {
			return set.dryRun(ctx, verb, n)
		}
		if purge && n > 0 && !o.yes && term.IsTerminal(int(os.Stdin.Fd())) {
			if !confirm(cmd, fmt.Sprintf("purge %d %s %s?", n, set.noun(), o.describe())) {
				return withCode(exitFailure, "nothing purged: not confirmed (--yes skips the question)")
			}
			// Only what was counted: dead letters that failed since are
			// left for another look.
			set.failedBefore(countedAt)
		}
		err = pgx.BeginFunc(ctx, set.pool, func(tx pgx.Tx) (err error) {
			if n, err = set.move(ctx, tx, purge); err != nil {
				return err
			}
			return set.audit(ctx, tx, purge, n)
		})
		if err != nil {
			return err
		}
		return output(cmd, map[string]int64{verb: n}, func(t *table) { t.note("%s %d %s", verb, n, set.noun()) })
	}
}

// describe says in words which dead letters the flags select.
func (o *dlqOptions) describe() string {
	parts := o.filters()
	if o.limit > 0 {
		parts = append(parts, fmt.Sprintf("--limit %d", o.limit))
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

// failedWindow is --older-than, --newer-than and --since as the times
// dead letters failed before and after.
func (o *dlqOptions) failedWindow() (before, after time.Time) {
	now := time.Now()
	if o.olderThan > 0 {
		before = now.Add(-o.olderThan)
	}
	if o.newerThan > 0 {
		after = now.Add(-o.newerThan)
	}
	if o.since.After(after) {
		after = o.since
	}
	return before, after
}
