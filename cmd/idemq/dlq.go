package main

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/urfave/cli/v3"

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
		&cli.StringSliceFlag{Name: "id", Usage: "outbox message id (repeatable)"},
		&cli.DurationFlag{Name: "older-than", Usage: "dead letters that failed longer ago than this"},
		&cli.DurationFlag{Name: "newer-than", Usage: "dead letters that failed within this"},
		&cli.IntFlag{Name: "limit", Usage: "at most this many (list: default 100; replay and purge: no limit)"},
	}
}

func dlqCommand() *cli.Command {
	return &cli.Command{
		Name:  "dlq",
		Usage: "list, show, replay and purge dead letters",
		Description: "Outbox dead letters are messages the relay gave up on; replay puts them back in the outbox (same id, same\n" +
			"place in their key's order). With --inbox, the consumers' dead letters: replay releases them so that the\n" +
			"next delivery of the message is applied again; purge forgets them. --inbox --conflicts does the same for\n" +
			"messages refused because their key was applied with another payload. Replay and purge exit 5 when a\n" +
			"--destination, --scope or --id matches no dead letter.",
		Action: groupAction,
		Commands: []*cli.Command{
			{Name: "list", Usage: "list dead letters, oldest first", Flags: dlqFlags(), Action: dlqList},
			{Name: "show", Usage: "show one dead letter with its payload", ArgsUsage: "ID (outbox) | SCOPE KEY (--inbox)",
				Flags: dlqFlags(), Action: dlqShow},
			{Name: "replay", Usage: "put dead letters back for another attempt", Flags: dlqFlags(), Action: dlqMove(false)},
			{Name: "purge", Usage: "delete dead letters", Flags: dlqFlags(), Action: dlqMove(true)},
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
		Limit:             cmd.Int("limit"),
	}
	for _, s := range cmd.StringSlice("id") {
		id, err := uuid.Parse(s)
		if err != nil {
			return f, usageError("--id %q: %v", s, err)
		}
		f.IDs = append(f.IDs, id)
	}
	if d := cmd.Duration("older-than"); d > 0 {
		f.FailedBefore = time.Now().Add(-d)
	}
	if d := cmd.Duration("newer-than"); d > 0 {
		f.FailedAfter = time.Now().Add(-d)
	}
	if f.Limit < 0 {
		return f, usageError("--limit must not be negative")
	}
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
	CreatedAt   time.Time         `json:"created_at"`
	FailedAt    time.Time         `json:"failed_at"`
}

func dlqList(ctx context.Context, cmd *cli.Command) error {
	if cmd.Bool("inbox") {
		return inboxDeadList(ctx, cmd)
	}
	f, err := outboxFilter(cmd)
	if err != nil {
		return err
	}
	ob, done, err := openOutbox(ctx, cmd)
	if err != nil {
		return err
	}
	defer done()
	dead, err := ob.DeadLetters(ctx, f)
	if err != nil {
		return err
	}
	return output(cmd, jsonDead(dead), func(t *table) {
		t.header("ID", "DESTINATION", "KEY", "ATTEMPTS", "FAILED", "ERROR")
		for _, d := range dead {
			t.row(d.ID.String(), d.Destination, d.Key, fmt.Sprint(d.Attempts), age(d.FailedAt)+" ago", clip(d.LastError, 80))
		}
		t.note("%d dead letters", len(dead))
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

// dlqMove replays (purge false) or purges the selected dead letters.
func dlqMove(purge bool) cli.ActionFunc {
	verb := map[bool]string{false: "replayed", true: "purged"}[purge]
	return func(ctx context.Context, cmd *cli.Command) error {
		var (
			n   int64
			err error
		)
		if cmd.Bool("inbox") {
			n, err = inboxDeadMove(ctx, cmd, purge)
		} else {
			n, err = outboxDeadMove(ctx, cmd, purge)
		}
		if err != nil {
			return err
		}
		if n == 0 && (cmd.IsSet("destination") || cmd.IsSet("scope") || cmd.IsSet("id")) {
			return withCode(exitNotFound, "no dead letter matches the given --destination, --scope or --id")
		}
		return output(cmd, map[string]int64{verb: n}, func(t *table) { t.note("%s %d dead letters", verb, n) })
	}
}

func outboxDeadMove(ctx context.Context, cmd *cli.Command, purge bool) (int64, error) {
	f, err := outboxFilter(cmd)
	if err != nil {
		return 0, err
	}
	ob, done, err := openOutbox(ctx, cmd)
	if err != nil {
		return 0, err
	}
	defer done()
	if purge {
		return ob.Purge(ctx, f)
	}
	return ob.Replay(ctx, f)
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
