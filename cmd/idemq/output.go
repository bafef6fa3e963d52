package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v3"
)

// output prints v as JSON with --json, else as the table human fills in.
func output(cmd *cli.Command, v any, human func(t *table)) error {
	w := cmd.Root().Writer
	if globals(cmd).json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0), w: w}
	human(t)
	return t.tw.Flush()
}

// table prints aligned columns for people.
type table struct {
	tw *tabwriter.Writer
	w  io.Writer
}

func (t *table) header(cols ...string) { t.row(cols...) }

func (t *table) row(cols ...string) {
	for i, c := range cols {
		// Tabs and newlines would break the columns.
		cols[i] = strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(c)
	}
	fmt.Fprintln(t.tw, strings.Join(cols, "\t"))
}

// note prints a line outside the columns.
func (t *table) note(format string, args ...any) { fmt.Fprintf(t.tw, format+"\n", args...) }

// age formats the time since at for a table: "3m12s".
func age(at time.Time) string {
	if at.IsZero() {
		return "-"
	}
	return time.Since(at).Round(time.Second).String()
}

// clip shortens s for a table column.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// payloadText shows a payload: as text when it is UTF-8, else its size.
func payloadText(p []byte) string {
	if utf8.Valid(p) {
		return string(p)
	}
	return fmt.Sprintf("(%d bytes of binary)", len(p))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// timestamp formats at for a table, in UTC.
func timestamp(at time.Time) string { return at.UTC().Format(time.RFC3339) }
