package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// writer owns the store's one write connection. Every write is an op sent
// to its goroutine; the goroutine takes the ops waiting at that moment (up
// to MaxBatch) and runs them in one BEGIN IMMEDIATE transaction, each under
// a savepoint of its own, so that one op's failure undoes that op alone.
// One commit, and so one WAL sync, serves the whole batch: group commit.
// Under load the batches grow by themselves, since ops pile up while the
// previous commit runs; an op alone is committed at once.
type writer struct {
	s    *Store
	conn *sql.Conn
	ops  chan *op
	quit chan struct{}
	done chan struct{}

	lastPrune time.Time
	stmts     map[string]*sql.Stmt
	// maxBusy is the busy timeout the store was opened with; busy the one
	// the connection has now (see lockWait).
	maxBusy, busy time.Duration
}

// op is one write: fn runs inside the batch's transaction with the
// database clock read for it.
type op struct {
	ctx  context.Context
	fn   func(tx *wtx) error
	done chan error
}

// wtx is what an op sees: the writer's connection inside the transaction,
// the database clock, and the notifications it wants sent when it commits.
type wtx struct {
	conn  querier
	ctx   context.Context
	now   time.Time
	notes []store.Notification
	stmts map[string]*sql.Stmt // the writer's prepared statements; nil in a caller's transaction
	// events are the audit events of the op's moves, written in one
	// statement when the op ends (see flushEvents).
	events []task.Event
	// Rows an op read ahead for a batch of moves (see prefetch); nil
	// when it did not.
	tasks   map[int64]*task.Task
	leases  map[int]leaseRow
	pending map[int64][]pendingCommand
	// depsLeft is the op's count of dependencies left for each pipeline
	// step it counted down, written once per step when the op ends (see
	// flushDeps) rather than once per dependency that ended: the steps of
	// a fan-out ending in one batch count their fan-in down once.
	depsLeft  map[int64]int
	depsOrder []int64        // the keys of depsLeft, in the order first counted
	depsDirty map[int64]bool // counts not written yet (saveTask writes one with its row)
}

// querier is what the writer's connection and a caller's *sql.Tx offer.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (tx *wtx) exec(query string, args ...any) (sql.Result, error) {
	if st, err := tx.stmt(query); st != nil || err != nil {
		if err != nil {
			return nil, err
		}
		return st.ExecContext(tx.ctx, args...)
	}
	return tx.conn.ExecContext(tx.ctx, query, args...)
}

func (tx *wtx) query(query string, args ...any) (*sql.Rows, error) {
	if st, err := tx.stmt(query); st != nil || err != nil {
		if err != nil {
			return nil, err
		}
		return st.QueryContext(tx.ctx, args...)
	}
	return tx.conn.QueryContext(tx.ctx, query, args...)
}

func (tx *wtx) queryRow(query string, args ...any) *sql.Row {
	if st, _ := tx.stmt(query); st != nil {
		return st.QueryRowContext(tx.ctx, args...)
	}
	return tx.conn.QueryRowContext(tx.ctx, query, args...)
}

// execScript runs SQL of several statements (a migration), which cannot be
// prepared as one.
func (tx *wtx) execScript(script string) error {
	_, err := tx.conn.ExecContext(tx.ctx, script)
	return err
}

// stmt returns the writer's prepared statement for query, preparing it on
// first use: SQLite spends more time parsing and planning a short
// statement than running it, and the writer runs the same few dozen
// statements all day. Nil, nil outside the writer (a caller's transaction).
func (tx *wtx) stmt(query string) (*sql.Stmt, error) {
	if tx.stmts == nil {
		return nil, nil
	}
	if st := tx.stmts[query]; st != nil {
		return st, nil
	}
	pc, ok := tx.conn.(interface {
		PrepareContext(context.Context, string) (*sql.Stmt, error)
	})
	if !ok {
		return nil, nil
	}
	st, err := pc.PrepareContext(tx.ctx, query)
	if err != nil {
		return nil, err
	}
	tx.stmts[query] = st
	return st, nil
}

// notify queues a notification: written to the outbox with the op, and
// delivered to this handle's listeners once the batch commits.
func (tx *wtx) notify(topic store.Topic, payload string) {
	tx.notes = append(tx.notes, store.Notification{Topic: topic, Payload: payload})
}

func startWriter(s *Store, conn *sql.Conn, busy time.Duration) *writer {
	w := &writer{s: s, conn: conn, ops: make(chan *op), quit: make(chan struct{}), done: make(chan struct{}),
		maxBusy: busy, busy: busy, stmts: map[string]*sql.Stmt{}}
	go w.loop()
	return w
}

// stop ends the goroutine after the batch it runs, and closes the
// connection. Safe to call twice.
func (w *writer) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
}

// write runs fn as one op and waits for its outcome. When ctx ends first
// the caller gets ctx's error; an op whose context has ended by the time
// its batch reaches it is skipped, so nothing is written for a caller that
// gave up before its turn.
func (s *Store) write(ctx context.Context, fn func(tx *wtx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	o := &op{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case s.w.ops <- o:
	case <-s.w.quit:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-o.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *writer) loop() {
	defer close(w.done)
	defer func() {
		for _, st := range w.stmts {
			_ = st.Close()
		}
		_ = w.conn.Close()
	}()
	batch := make([]*op, 0, MaxBatch)
	for {
		select {
		case o := <-w.ops:
			batch = append(batch[:0], o)
		case <-w.quit:
			return
		}
	more:
		for len(batch) < MaxBatch {
			select {
			case o := <-w.ops:
				batch = append(batch, o)
			default:
				break more
			}
		}
		w.run(batch)
		clear(batch)
	}
}

// batchTimeout bounds the statements of one batch. The ops' own contexts
// are not used for statements: cancelling one would interrupt the shared
// connection in the middle of another op's work.
const batchTimeout = time.Minute

// run executes one batch and answers every op in it.
func (w *writer) run(batch []*op) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	errs := make([]error, len(batch))
	var notes []store.Notification

	fail := func(err error) {
		for _, o := range batch {
			o.done <- err
		}
	}
	// Wait for the write lock no longer than the most patient caller of
	// the batch: a writer stuck behind another process's lock would hold
	// up every later op of this process too, for callers that have given
	// up. Ops whose callers have already given up are answered at once.
	wait, live := w.lockWait(batch)
	if live == 0 {
		for i, o := range batch {
			errs[i] = o.ctx.Err()
			o.done <- errs[i]
		}
		return
	}
	if wait != w.busy {
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf(`PRAGMA busy_timeout = %d`, wait.Milliseconds())); err == nil {
			w.busy = wait
		}
	}
	if _, err := w.conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		fail(wrap(err, "begin a write"))
		return
	}
	for i, o := range batch {
		if err := o.ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		tx := &wtx{conn: w.conn, ctx: ctx, stmts: w.stmts}
		errs[i] = w.runOne(tx, o)
		if errs[i] == nil {
			notes = append(notes, tx.notes...)
		}
	}
	w.prune(ctx)
	if _, err := w.conn.ExecContext(ctx, `COMMIT`); err != nil {
		_, _ = w.conn.ExecContext(ctx, `ROLLBACK`)
		fail(wrap(err, "commit"))
		return
	}
	w.s.deliver(notes)
	for i, o := range batch {
		o.done <- errs[i]
	}
}

// lockWait is how long the batch may wait for the write lock: the busy
// timeout, cut to the latest deadline among the ops whose callers still
// wait (at least a millisecond); and how many such ops there are.
func (w *writer) lockWait(batch []*op) (time.Duration, int) {
	live := 0
	var latest time.Time
	unbounded := false
	for _, o := range batch {
		if o.ctx.Err() != nil {
			continue
		}
		live++
		d, ok := o.ctx.Deadline()
		if !ok {
			unbounded = true
		} else if d.After(latest) {
			latest = d
		}
	}
	if unbounded || live == 0 {
		return w.maxBusy, live
	}
	wait := min(time.Until(latest), w.maxBusy)
	// Whole milliseconds, rounded up, so that the setting changes only
	// when the callers' deadlines do by a millisecond or more.
	wait = max(time.Millisecond, (wait + time.Millisecond - 1).Truncate(time.Millisecond))
	return wait, live
}

// runOne runs one op under a savepoint, with its notifications written to
// the outbox in the same savepoint.
func (w *writer) runOne(tx *wtx, o *op) error {
	if _, err := tx.exec(`SAVEPOINT op`); err != nil {
		return wrap(err, "savepoint")
	}
	err := tx.run(o.fn, w.s.origin)
	if err != nil {
		if _, rerr := tx.exec(`ROLLBACK TO op`); rerr != nil {
			return fmt.Errorf("%w; and undoing it: %w", err, translate(rerr))
		}
	}
	if _, rerr := tx.exec(`RELEASE op`); rerr != nil && err == nil {
		return wrap(rerr, "release savepoint")
	}
	return err
}

// run runs fn as one op in tx, the writer's transaction or a caller's: on
// the database clock, read first; then the op's dependency counts and
// audit events, written once each; then its announcements, written to the
// outbox under origin, so that listeners hear of them when, and only if,
// the transaction commits.
func (tx *wtx) run(fn func(tx *wtx) error, origin string) error {
	var us int64
	if err := tx.queryRow(`SELECT ` + nowSQL).Scan(&us); err != nil {
		return wrap(err, "read the clock")
	}
	tx.now = time.UnixMicro(us).UTC()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.flushDeps(); err != nil {
		return err
	}
	if err := tx.flushEvents(); err != nil {
		return err
	}
	for _, n := range tx.notes {
		if _, err := tx.exec(insertNotificationSQL, string(n.Topic), n.Payload, origin, tx.now.UnixMicro()); err != nil {
			return wrap(err, "write the outbox")
		}
	}
	return nil
}

// flushDeps writes the counts of dependencies left that the op's
// resolves changed.
func (tx *wtx) flushDeps() error {
	for _, id := range tx.depsOrder {
		if !tx.depsDirty[id] {
			continue
		}
		if _, err := tx.exec(`UPDATE flotilla_tasks SET deps_left = ? WHERE id = ?`, tx.depsLeft[id], id); err != nil {
			return wrap(err, "count down the dependencies of task %d", id)
		}
	}
	tx.depsLeft, tx.depsOrder, tx.depsDirty = nil, nil, nil
	return nil
}

// eventsChunk is how many events one INSERT carries (10 parameters each).
const eventsChunk = 64

// flushEvents writes the events the op's moves recorded.
func (tx *wtx) flushEvents() error {
	for len(tx.events) > 0 {
		n := min(len(tx.events), eventsChunk)
		args := make([]any, 0, 10*n)
		for _, e := range tx.events[:n] {
			args = append(args, e.TaskID, e.Seq, string(e.From), string(e.To), e.At.UnixMicro(), e.Node, e.Epoch,
				e.Attempt, e.Reason, e.Error)
		}
		q := `INSERT INTO flotilla_task_events (task_id, seq, from_status, to_status, at, node, epoch, attempt, reason, error)
VALUES ` + strings.Repeat(`(?, ?, ?, ?, ?, ?, ?, ?, ?, ?), `, n-1) + `(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
		if _, err := tx.exec(q, args...); err != nil {
			return wrap(err, "record %d events", n)
		}
		tx.events = tx.events[n:]
	}
	return nil
}

const insertNotificationSQL = `INSERT INTO flotilla_notifications (topic, payload, origin, at) VALUES (?, ?, ?, ?)`

// outboxRetention is how long an outbox row stays: far longer than the
// poll interval, so that a listener that was busy for a moment still finds
// what it missed, and short enough that the table stays a few pages.
const outboxRetention = 10 * time.Second

// prune deletes old outbox rows, at most once a second.
func (w *writer) prune(ctx context.Context) {
	now := time.Now()
	if now.Sub(w.lastPrune) < time.Second {
		return
	}
	w.lastPrune = now
	// Before the first migration there is no outbox: nothing to prune.
	_, _ = w.conn.ExecContext(ctx, `SAVEPOINT prune`)
	_, err := w.conn.ExecContext(ctx, `DELETE FROM flotilla_notifications WHERE at < `+nowSQL+` - ?`,
		outboxRetention.Microseconds())
	if err != nil {
		_, _ = w.conn.ExecContext(ctx, `ROLLBACK TO prune`)
	}
	_, _ = w.conn.ExecContext(ctx, `RELEASE prune`)
}
