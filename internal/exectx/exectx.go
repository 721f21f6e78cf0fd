// Package exectx is the transaction of an execution: a pgx.Tx that sends
// its BEGIN with the handler's first statement and its COMMIT with the
// key's completion.
package exectx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/internal/pgretry"
)

// Options configures a Tx.
type Options struct {
	// Pool gives the transaction its connection.
	Pool *pgxpool.Pool
	// Unavailable is wrapped into the errors of a Postgres that did not
	// answer (the engine's ErrUnavailable).
	Unavailable error
	// CommitRefused is what Commit returns (the engine's
	// ErrCommitByHandler).
	CommitRefused error
	// Prepare, when set, runs on the connection before the BEGIN (the
	// single-commit mode's keepalives, which do their work once per
	// connection).
	Prepare func(ctx context.Context, conn *pgx.Conn) error
	// Log receives what cannot be returned (slog.Default when nil).
	Log *slog.Logger
}

// New returns a Tx that has not begun.
func New(opts Options) *Tx {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	return &Tx{opts: opts}
}

// Tx is the transaction of an execution: a pgx.Tx that sends its BEGIN
// with the handler's first statement (pgx's Batch.BeginTx), and its COMMIT
// with the key's completion (CommitWith), so a handler that writes one row
// costs the round trip of that write and one more, not three. A handler
// that writes nothing sends neither. Begin (savepoints), CopyFrom, Prepare
// and LargeObjects as the first call send the BEGIN alone. The isolation is
// READ COMMITTED whatever the database's default: the completion must see
// the lease renewals committed since the claim.
type Tx struct {
	opts Options

	mu     sync.Mutex
	conn   *pgxpool.Conn // held from the first statement to the end
	tx     pgx.Tx        // pgx's transaction on conn, once begun
	closed bool          // committed, rolled back or given up
	// open counts the rows and batch results handed out and not yet
	// read to their end or closed: the connection is theirs meanwhile.
	open atomic.Int32
}

// acquire returns the transaction's connection, taking one from the pool
// on first use.
func (t *Tx) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	if t.conn == nil {
		conn, err := t.opts.Pool.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w: acquire a connection: %w", t.opts.Unavailable, err)
		}
		t.conn = conn
	}
	return t.conn, nil
}

// sendFirst sends the BEGIN and then b's statements in one round trip, and
// returns the results of b's statements. A pooled connection found dead
// (Postgres restarted) is replaced and everything sent once more: none of
// it ran.
func (t *Tx) sendFirst(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for attempt := 0; ; attempt++ {
		conn, err := t.acquire(ctx)
		if err != nil {
			t.closed = true
			return pgx.FailedBatchResults(b, err)
		}
		br, err := t.sendBegin(ctx, conn, b)
		if err == nil {
			return br
		}
		t.release()
		if attempt > 0 || ctx.Err() != nil || !pgretry.DeadConnection(err) {
			t.closed = true
			return pgx.FailedBatchResults(b, fmt.Errorf("%w: begin: %w", t.opts.Unavailable, err))
		}
		t.opts.Pool.Reset()
	}
}

// sendBegin runs Prepare, if any, then sends the BEGIN and b's statements
// on conn; on error the results are closed.
func (t *Tx) sendBegin(ctx context.Context, conn *pgxpool.Conn, b *pgx.Batch) (pgx.BatchResults, error) {
	if t.opts.Prepare != nil {
		if err := t.opts.Prepare(ctx, conn.Conn()); err != nil {
			return nil, err
		}
	}
	withBegin := &pgx.Batch{}
	withBegin.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	withBegin.QueuedQueries = append(withBegin.QueuedQueries, b.QueuedQueries...)
	br := conn.SendBatch(ctx, withBegin)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	t.tx = br.Tx()
	return br, nil
}

// BeginWith sends the BEGIN and the statements queue puts on a batch in
// one round trip, and reads their results.
func (t *Tx) BeginWith(ctx context.Context, queue func(*pgx.Batch)) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.tx != nil {
		return errors.New("onceonly: the execution's transaction has begun already")
	}
	b := &pgx.Batch{}
	queue(b)
	return t.sendFirst(ctx, b).Close()
}

// begin sends the BEGIN alone, for the methods that cannot carry it.
func (t *Tx) begin(ctx context.Context) (pgx.Tx, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return nil, pgx.ErrTxClosed
	case t.tx != nil:
		return t.tx, nil
	}
	tx, err := pgretry.OnLiveConnection(ctx, t.opts.Pool, func() (pgx.Tx, error) {
		conn, err := t.acquire(ctx)
		if err != nil {
			return nil, err
		}
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			t.release()
		}
		return tx, err
	})
	if err != nil {
		t.closed = true
		return nil, fmt.Errorf("%w: begin: %w", t.opts.Unavailable, err)
	}
	t.tx = tx
	return tx, nil
}

// release returns the connection to the pool (which closes it if a
// transaction is still open on it).
func (t *Tx) release() {
	if t.conn != nil {
		t.conn.Release()
		t.conn = nil
	}
}

// Exec runs sql in the transaction.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	case t.tx != nil:
		return t.tx.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := t.sendFirst(ctx, b)
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs sql in the transaction.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return nil, pgx.ErrTxClosed
	case t.tx != nil:
		return t.track(t.tx.Query(ctx, sql, args...)) //nolint:sqlclosecheck // the caller closes the rows it asked for
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := t.sendFirst(ctx, b)
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return t.track(&batchRows{Rows: rows, results: br}, nil) //nolint:sqlclosecheck // the caller closes the rows it asked for
}

// QueryRow runs sql in the transaction; the row is read by its Scan.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return firstRow{rows: rows, err: err}
}

// SendBatch sends b in the transaction.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	case t.tx != nil:
		return t.trackBatch(t.tx.SendBatch(ctx, b))
	}
	return t.trackBatch(t.sendFirst(ctx, b))
}

// Begin starts a pseudo nested transaction (a savepoint).
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return savepoint{Tx: sp, t: t}, nil
}

// CopyFrom copies rows into tableName in the transaction.
func (t *Tx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// Prepare prepares a statement on the transaction's connection.
func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return tx.Prepare(ctx, name, sql)
}

// LargeObjects returns the large objects of the transaction. pgx's
// interface gives it no context and no error: when the transaction cannot
// begin within five seconds, the LargeObjects returned cannot be used.
func (t *Tx) LargeObjects() pgx.LargeObjects {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tx, err := t.begin(ctx)
	if err != nil {
		t.opts.Log.Error("begin the execution's transaction for LargeObjects", "err", err)
		return pgx.LargeObjects{}
	}
	return tx.LargeObjects()
}

// Conn returns the transaction's connection (nil before its first
// statement).
func (t *Tx) Conn() *pgx.Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == nil {
		return nil
	}
	return t.conn.Conn()
}

// ErrNotOpen is returned by KeepAlive for a transaction that has not
// begun or has ended.
var ErrNotOpen = errors.New("onceonly: the execution's transaction is not open")

// ErrRowsOpen is returned by KeepAlive while rows or batch results the
// handler has not closed hold the connection: the session may be idle, its
// timeout running, but nothing can be sent to restart it.
var ErrRowsOpen = errors.New("onceonly: the execution's transaction has rows open")

// KeepAlive proves the transaction's client alive to Postgres while the
// handler leaves it idle: a statement that restarts the session's
// idle_in_transaction_session_timeout. While a call of the handler's is
// under way the session is active, not idle: KeepAlive sends nothing and
// returns nil. It returns ErrRowsOpen while rows are open, ErrNotOpen once
// the transaction ended, and Postgres's error when it ended it.
func (t *Tx) KeepAlive(ctx context.Context) error {
	if !t.mu.TryLock() {
		return nil // a call of the handler's is under way
	}
	defer t.mu.Unlock()
	if t.closed || t.tx == nil {
		return ErrNotOpen
	}
	if t.open.Load() > 0 {
		return ErrRowsOpen
	}
	if err := t.conn.Conn().PgConn().Exec(ctx, "SELECT 1").Close(); err != nil {
		return fmt.Errorf("keep the transaction alive: %w", err)
	}
	return nil
}

// Ended reports whether the transaction was committed, rolled back or
// given up: nothing more can run in it.
func (t *Tx) Ended() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// Commit refuses: the engine commits with the key's completion.
func (t *Tx) Commit(context.Context) error { return t.opts.CommitRefused }

// Rollback rolls the transaction back and returns its connection.
func (t *Tx) Rollback(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	defer t.release()
	if t.tx == nil {
		return nil
	}
	if err := t.tx.Rollback(ctx); err != nil {
		return fmt.Errorf("rollback: %w", err)
	}
	return nil
}

// CommitWith sends the statements queue puts on a batch (the key's
// completion) and the COMMIT in one round trip, and returns the
// connection. Those statements must fail, not return nothing, when the
// execution lost its key: Postgres skips a COMMIT that follows a failed
// statement. Without a BEGIN sent, they run on their own, on a live
// connection.
func (t *Tx) CommitWith(ctx context.Context, queue func(*pgx.Batch)) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	if t.tx == nil {
		_, err := pgretry.OnLiveConnection(ctx, t.opts.Pool, func() (struct{}, error) {
			b := &pgx.Batch{}
			queue(b)
			return struct{}{}, t.opts.Pool.SendBatch(ctx, b).Close()
		})
		return err
	}
	defer t.release()
	b := &pgx.Batch{}
	queue(b)
	b.Queue("commit")
	// Sent on the connection, past pgx's transaction object, which would
	// refuse a batch holding its COMMIT; that object is not used again.
	err := t.conn.SendBatch(ctx, b).Close()
	if err != nil && t.conn.Conn().PgConn().TxStatus() != 'I' {
		_ = t.tx.Rollback(context.WithoutCancel(ctx))
	}
	return err
}

// savepoint is a pseudo nested transaction of t (pgx's, a savepoint) whose
// calls are made under t's lock, as t's own are, so KeepAlive never sends
// on the connection while one is under way.
type savepoint struct {
	pgx.Tx
	t *Tx
}

// Begin starts a pseudo nested transaction inside this one.
func (s savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	sp, err := s.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return savepoint{Tx: sp, t: s.t}, nil
}

// Commit releases the savepoint.
func (s savepoint) Commit(ctx context.Context) error {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.Tx.Commit(ctx)
}

// Rollback rolls back to the savepoint.
func (s savepoint) Rollback(ctx context.Context) error {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.Tx.Rollback(ctx)
}

// Exec runs sql in the savepoint.
func (s savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.Tx.Exec(ctx, sql, args...)
}

// Query runs sql in the savepoint; the connection stays busy until the
// rows are closed.
func (s savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.t.track(s.Tx.Query(ctx, sql, args...)) //nolint:sqlclosecheck // the caller closes the rows it asked for
}

// QueryRow runs sql in the savepoint; the row is read by its Scan.
func (s savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := s.Query(ctx, sql, args...)
	return firstRow{rows: rows, err: err}
}

// SendBatch sends b in the savepoint.
func (s savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.t.trackBatch(s.Tx.SendBatch(ctx, b))
}

// track counts rows among the open ones until they are read to their end
// or closed; t.mu is held.
func (t *Tx) track(rows pgx.Rows, err error) (pgx.Rows, error) {
	if err != nil {
		return rows, err
	}
	t.open.Add(1)
	return &trackedRows{Rows: rows, t: t}, nil
}

// trackBatch counts br among the open results until it is closed; t.mu
// is held.
func (t *Tx) trackBatch(br pgx.BatchResults) pgx.BatchResults {
	t.open.Add(1)
	return &trackedBatch{BatchResults: br, t: t}
}

// trackedRows are rows counted in their transaction's open ones.
type trackedRows struct {
	pgx.Rows
	t    *Tx
	done bool
}

// Next advances to the next row; after the last the rows are done.
func (r *trackedRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

// Close closes the rows.
func (r *trackedRows) Close() {
	r.Rows.Close()
	r.finish()
}

func (r *trackedRows) finish() {
	if !r.done {
		r.done = true
		r.t.open.Add(-1)
	}
}

// trackedBatch is a batch's results, counted in their transaction's open
// ones.
type trackedBatch struct {
	pgx.BatchResults
	t    *Tx
	done bool
}

// Close reads the rest of the results and closes them.
func (b *trackedBatch) Close() error {
	err := b.BatchResults.Close()
	if !b.done {
		b.done = true
		b.t.open.Add(-1)
	}
	return err
}

// CopyFrom copies rows into tableName in the savepoint.
func (s savepoint) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.Tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// Prepare prepares a statement on the transaction's connection.
func (s savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.Tx.Prepare(ctx, name, sql)
}

// batchRows are the rows of a statement sent in a batch: closing them
// reads the rest of the batch.
type batchRows struct {
	pgx.Rows
	results pgx.BatchResults
	done    bool
	err     error
}

// Next advances to the next row; after the last it closes the batch.
func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// Close closes the rows and the batch.
func (r *batchRows) Close() {
	r.Rows.Close()
	if !r.done {
		r.done = true
		r.err = r.results.Close()
	}
}

// Err returns the rows' error, or else the batch's.
func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// firstRow is the row of QueryRow: the first of rows.
type firstRow struct {
	rows pgx.Rows
	err  error
}

// Scan reads the first row into dest; pgx.ErrNoRows when there is none.
func (r firstRow) Scan(dest ...any) error {
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
