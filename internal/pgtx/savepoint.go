package pgtx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Batch is the transaction the handlers of a batch see, made by
// [NewBatch]. Each message runs under the savepoint idemq_sp_message, which
// Batch establishes lazily, in the same round trip as the handler's first
// statement (prefixed to it in a pgx batch). So a batch costs no round trip
// per message beyond the handler's own, and a handler that writes nothing
// costs none at all. Once the transaction under it ends, every method
// fails with pgx.ErrTxClosed, as pgx's own do.
type Batch struct {
	handlerTx
	// pending are the savepoint commands to send before the next statement.
	pending []string
	// exists: the savepoint is established; dirty: a message that
	// succeeded wrote under it, so it must be renewed for the next one.
	exists, dirty bool
	// wrote: the current message sent a statement.
	wrote bool
}

// messageSavepoint is the savepoint each message of a Batch runs under.
const messageSavepoint = "idemq_sp_message"

// NewBatch wraps tx for the handlers of a batch; call Next before each
// message and Done after it.
func NewBatch(tx pgx.Tx) *Batch { return &Batch{handlerTx: handlerTx{tx}} }

// Next prepares the savepoint for the next message.
func (t *Batch) Next() {
	t.wrote = false
	switch {
	case !t.exists:
		t.pending = []string{"SAVEPOINT " + messageSavepoint}
	case t.dirty:
		t.pending = []string{"RELEASE SAVEPOINT " + messageSavepoint, "SAVEPOINT " + messageSavepoint}
	default:
		t.pending = nil
	}
}

// Done settles the current message's savepoint: kept on success, rewound
// on failure. It returns an error only if the rewind failed.
func (t *Batch) Done(ctx context.Context, failed bool) error {
	if !t.wrote {
		return nil // nothing ran under this message
	}
	if !failed {
		t.dirty = true
		return nil
	}
	t.dirty = false
	_, err := t.Tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+messageSavepoint)
	return err
}

// sent records that a statement goes out with the pending commands.
func (t *Batch) sent() []string {
	p := t.pending
	t.pending, t.exists, t.dirty, t.wrote = nil, true, false, true
	return p
}

// flush sends the pending commands on their own, before a call that cannot
// carry them.
func (t *Batch) flush(ctx context.Context) error {
	for _, sql := range t.sent() {
		if _, err := t.Tx.Exec(ctx, sql); err != nil {
			return err
		}
	}
	return nil
}

func (t *Batch) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	pending := t.sent()
	if len(pending) == 0 {
		return t.Tx.SendBatch(ctx, b)
	}
	prefixed := &pgx.Batch{}
	for _, sql := range pending {
		prefixed.Queue(sql)
	}
	prefixed.QueuedQueries = append(prefixed.QueuedQueries, b.QueuedQueries...)
	results := t.Tx.SendBatch(ctx, prefixed)
	for range pending {
		// A failed savepoint fails the statements after it too, so the
		// caller sees the error on its own results.
		_, _ = results.Exec()
	}
	return results
}

func (t *Batch) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if len(t.pending) == 0 {
		t.wrote = true
		return t.Tx.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	results := t.SendBatch(ctx, b)
	tag, err := results.Exec()
	if cerr := results.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *Batch) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if len(t.pending) == 0 {
		t.wrote = true
		return t.Tx.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	results := t.SendBatch(ctx, b)
	rows, err := results.Query()
	if err != nil {
		results.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, results: results}, nil
}

func (t *Batch) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if len(t.pending) == 0 {
		t.wrote = true
		return t.Tx.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	return row{rows, err}
}

func (t *Batch) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *Batch) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

func (t *Batch) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

// LargeObjects and Conn give the handler ways to write that bypass batchTx,
// so the savepoint is established first.
func (t *Batch) LargeObjects() pgx.LargeObjects {
	t.flushOrPoison()
	return t.Tx.LargeObjects()
}

func (t *Batch) Conn() *pgx.Conn {
	t.flushOrPoison()
	return t.Tx.Conn()
}

// flushOrPoison flushes for calls without a context. If that fails the
// transaction is broken anyway: its next statement fails and so does the
// batch's commit.
func (t *Batch) flushOrPoison() { _ = t.flush(context.Background()) }

// batchRows releases the batch its rows came from once they are read or
// closed, as pgx does for a plain query.
type batchRows struct {
	pgx.Rows
	results pgx.BatchResults
	err     error
	closed  bool
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.results.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// row is pgx.Row over rows, for QueryRow.
type row struct {
	rows pgx.Rows
	err  error
}

func (r row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

var _ pgx.Tx = (*Batch)(nil)

// ErrHandlerTx is returned to a handler that tries to end the transaction
// it was given.
var ErrHandlerTx = errors.New("consumer: the handler must not commit or roll back the transaction; return an error to roll back")

// Handler returns tx as a handler sees it: everything but ending it. It
// remembers the first statement error, for [HandlerTx.Aborted].
func Handler(tx pgx.Tx) *HandlerTx { return &HandlerTx{handlerTx: handlerTx{tx}} }

// HandlerTx is the transaction one message's handler sees.
type HandlerTx struct {
	handlerTx
	first error // the first statement error
}

func (t *HandlerTx) note(err error) {
	if t.first == nil {
		t.first = err
	}
}

func (t *HandlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := t.Tx.Exec(ctx, sql, args...)
	t.note(err)
	return tag, err
}

func (t *HandlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := t.Tx.Query(ctx, sql, args...)
	if err != nil {
		t.note(err)
		return nil, err
	}
	return &notedRows{Rows: rows, t: t}, nil
}

func (t *HandlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return row{rows, err}
}

func (t *HandlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	n, err := t.Tx.CopyFrom(ctx, table, columns, src)
	t.note(err)
	return n, err
}

// Aborted returns an error when a statement failed and left the
// transaction aborted although the handler returned nil (it swallowed
// the error): the commit would roll back. The error carries the first
// statement error the handler saw.
func (t *HandlerTx) Aborted() error {
	err := Aborted(t.Tx)
	if err != nil && t.first != nil {
		err = fmt.Errorf("%w: %w", err, t.first)
	}
	return err
}

// Aborted returns ErrAborted when tx's connection reports a failed
// transaction block (a statement failed and nothing rolled back to a
// savepoint since).
func Aborted(tx pgx.Tx) error {
	if conn := tx.Conn(); conn != nil && !conn.IsClosed() && conn.PgConn().TxStatus() == 'E' {
		return ErrAborted
	}
	return nil
}

// ErrAborted reports a handler that returned nil after a statement of its
// transaction failed.
var ErrAborted = errors.New("consumer: the handler returned nil, but a statement of its transaction failed and Postgres aborted it; return that statement's error (or roll back to a savepoint of your own)")

// notedRows notes the error that ends a query's rows.
type notedRows struct {
	pgx.Rows
	t *HandlerTx
}

func (r *notedRows) Close() {
	r.Rows.Close()
	r.t.note(r.Rows.Err())
}

func (r *notedRows) Err() error {
	err := r.Rows.Err()
	r.t.note(err)
	return err
}

// handlerTx is the transaction a handler sees: everything but ending it.
type handlerTx struct{ pgx.Tx }

func (handlerTx) Commit(context.Context) error   { return ErrHandlerTx }
func (handlerTx) Rollback(context.Context) error { return ErrHandlerTx }
