package testenv

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// Logs keeps every record logged through its [Logs.Logger], for tests that
// assert on what a component logged (one line per change of state, say).
// It is safe for concurrent use.
type Logs struct {
	mu   sync.Mutex
	recs []LogRecord
}

// LogRecord is one kept record: its level, message and attributes (those
// of the logger's With included), as text.
type LogRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

// Logger returns a logger that keeps its records (Debug and up) in l.
func (l *Logs) Logger() *slog.Logger { return slog.New(&logsHandler{logs: l}) }

// Records returns the records whose message starts with msg and whose
// attributes include attrs (key, value, key, value, ...: values compared
// as text, fmt.Sprint of the logged value).
func (l *Logs) Records(msg string, attrs ...string) []LogRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []LogRecord
	for _, r := range l.recs {
		match := strings.HasPrefix(r.Msg, msg)
		for i := 0; match && i+1 < len(attrs); i += 2 {
			v, ok := r.Attrs[attrs[i]]
			match = ok && v == attrs[i+1]
		}
		if match {
			out = append(out, r)
		}
	}
	return out
}

type logsHandler struct {
	logs  *Logs
	attrs []slog.Attr
}

func (h *logsHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *logsHandler) Handle(_ context.Context, r slog.Record) error {
	rec := LogRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	add := func(a slog.Attr) bool {
		rec.Attrs[a.Key] = fmt.Sprint(a.Value.Resolve().Any())
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.logs.mu.Lock()
	defer h.logs.mu.Unlock()
	h.logs.recs = append(h.logs.recs, rec)
	return nil
}

func (h *logsHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logsHandler{logs: h.logs, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

// WithGroup keeps the group's attributes under their own keys: tests match
// on the keys the component chose.
func (h *logsHandler) WithGroup(string) slog.Handler { return h }
