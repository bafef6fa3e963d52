package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"time"

	"github.com/idemq/idemq/request"
)

// serveTx runs a protected request in the transaction-owning mode
// (Config.OwnTransaction).
func (m *Middleware) serveTx(ctx context.Context, w nethttp.ResponseWriter, r *nethttp.Request, next nethttp.Handler,
	body []byte, ev *ResultEvent, reject func(request.Result, string, int, error, string, time.Duration)) {
	d, err := m.guard.BeginTx(ctx, ev.ID, m.cfg.Fingerprint(r, body))
	if err != nil {
		m.rejectBegin(r, err, reject)
		return
	}
	if d.Replay != nil {
		ev.Result, ev.Status = request.ResultReplayed, m.replayRecord(w, *d.Replay)
		return
	}
	a := d.Run
	c := newCapture(w, m.cfg.MaxResponse)
	r2 := r.WithContext(a.Context(ctx))
	r2.Body = io.NopCloser(bytes.NewReader(body))
	defer func() {
		if v := recover(); v != nil {
			// Nothing the handler wrote stays; the panic goes on to the
			// server, which aborts the response.
			ev.Result, ev.Err = request.ResultReleased, fmt.Errorf("handler panicked: %v", v)
			_ = a.Rollback(ctx)
			panic(v)
		}
	}()
	next.ServeHTTP(c, r2)
	ev.Status = c.statusOr()
	if !m.cfg.Final(Outcome{Status: ev.Status, Timeout: errors.Is(ctx.Err(), context.DeadlineExceeded),
		ClientGone: errors.Is(r.Context().Err(), context.Canceled), Written: c.status != 0}) {
		ev.Result, ev.Err = request.ResultReleased, a.Rollback(ctx)
		c.send(nil)
		return
	}
	if err := a.Commit(ctx, m.response(c)); err != nil {
		ev.Result, ev.Err = request.ResultStoreFailed, err
		if c.overflow {
			return // sent already, as its size allows no other way
		}
		ev.Status = nethttp.StatusInternalServerError
		c.reset()
		writeProblem(c.w, ProblemNotCommitted, ev.Status, ev.ID.Key,
			"the request's transaction did not commit; retry with the same key: the retry gets this request's response if it committed after all, or runs it", 0)
		return
	}
	ev.Result = request.ResultCompleted
	c.send(nethttp.Header{HeaderExpires: {time.Now().Add(m.guard.Store().RecordTTL()).UTC().Format(nethttp.TimeFormat)}})
}
