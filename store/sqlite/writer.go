package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	sqlite "modernc.org/sqlite"

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
//
// Every caller is told the truth about its write (see op):
//
//   - an op whose caller gives up before the op has run to its end is
//     rolled back to its savepoint, so that a caller told "context deadline
//     exceeded" has written nothing;
//   - an op that ran to its end is sealed: its caller waits for the
//     batch's commit, however late, and hears how it went;
//   - when SQLite itself rolls the whole transaction back (a full disk, an
//     I/O error, an interrupt), every op sealed in it is told that it
//     failed, and the ops of the batch not yet run go on in a transaction of
//     their own. Nothing commits on the connection but the writer's COMMIT
//     (a commit hook vetoes any other), so a statement run after such a
//     rollback cannot commit alone.
//
// The statements that end an op or a batch (ROLLBACK TO, RELEASE, COMMIT,
// ROLLBACK) run on no deadline, so that a batch that outlived its own never
// leaves the connection inside a transaction holding the file's lock.
type writer struct {
	s    *Store
	db   *sql.DB // the pool of the one connection
	conn *sql.Conn
	ops  chan *op
	quit chan struct{}
	done chan struct{}

	lastPrune time.Time
	stmts     map[string]*sql.Stmt
	// maxBusy is the busy timeout the store was opened with; busy the one
	// the connection has now (see lockWait).
	maxBusy, busy time.Duration
	// batchTimeout bounds the statements of one batch (defaultBatchTimeout).
	batchTimeout time.Duration

	// committing is set while the writer's own COMMIT runs: the commit
	// hook refuses every other commit on the connection. rolledBack is set
	// by the rollback hook whenever a transaction ends in a rollback,
	// SQLite's own included.
	committing, rolledBack atomic.Bool

	// afterOp, when set (by tests), runs after each op's body and before
	// the op is sealed or undone.
	afterOp func(*op)
}

// op states: an op is live until the writer seals it, once its body has run
// without error, or its caller abandons it, whichever comes first.
const (
	opLive int32 = iota
	opSealed
	opAbandoned
)

// op is one write: fn runs inside the batch's transaction with the
// database clock read for it.
type op struct {
	ctx    context.Context
	fn     func(tx *wtx) error
	done   chan error
	noWait bool // fail with store.ErrBusy rather than wait for another process's lock
	// budget, when set, bounds the statements of the op's batch instead
	// of the writer's batchTimeout.
	budget time.Duration
	state  atomic.Int32
}

// seal commits the op to the batch's fate: its caller will wait for the
// commit. False when the caller has abandoned it.
func (o *op) seal() bool { return o.state.CompareAndSwap(opLive, opSealed) }

// abandon withdraws the op for a caller that gives up. False when the op is
// sealed already: the caller must wait for the batch's outcome.
func (o *op) abandon() bool { return o.state.CompareAndSwap(opLive, opAbandoned) }

// givenUp reports whether the op's caller has given up, abandoning the op
// for it when its context has ended and it is still live.
func (o *op) givenUp() bool {
	return o.state.Load() == opAbandoned || o.ctx.Err() != nil && o.abandon()
}

// answer tells the op's caller its outcome (done has room for one).
func (o *op) answer(err error) { o.done <- err }

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

// newWriter prepares the writer of db, the store's write pool, whose one
// connection it takes, with its hooks registered. Its goroutine is not
// started (start does).
func newWriter(s *Store, db *sql.DB, busy time.Duration) (*writer, error) {
	w := &writer{s: s, db: db, ops: make(chan *op), quit: make(chan struct{}), done: make(chan struct{}),
		maxBusy: busy, busy: busy, batchTimeout: defaultBatchTimeout, stmts: map[string]*sql.Stmt{}}
	if err := w.connect(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *writer) start() { go w.loop() }

// checkWritable refuses a file that SQLite opened read-only because this
// user may not write it: every write would fail with "attempt to write a
// readonly database".
func (w *writer) checkWritable(ctx context.Context) error {
	var ro bool
	err := w.conn.Raw(func(dc any) error {
		c, ok := dc.(interface{ IsReadOnly(string) (bool, error) })
		if !ok {
			return nil
		}
		var err error
		ro, err = c.IsReadOnly("main")
		return err
	})
	if err != nil {
		return err
	}
	if ro {
		return errors.New("the file is not writable by this user: open it read-only to read it")
	}
	return ctx.Err()
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

// write runs fn as one op and waits for its outcome. A caller whose ctx
// ends before its op has run to its end gets ctx's error and the op is
// undone (or never run); once the op has run to its end, the caller waits
// for the batch's commit and gets its true outcome, even after ctx ended.
func (s *Store) write(ctx context.Context, fn func(tx *wtx) error) error {
	return s.send(ctx, &op{ctx: ctx, fn: fn})
}

// writeNoWait is write for an op that must not wait for another process's
// write lock: it fails with store.ErrBusy at once instead.
func (s *Store) writeNoWait(ctx context.Context, fn func(tx *wtx) error) error {
	return s.send(ctx, &op{ctx: ctx, fn: fn, noWait: true})
}

func (s *Store) send(ctx context.Context, o *op) error {
	if s.w == nil {
		return ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	o.done = make(chan error, 1)
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
		if o.abandon() {
			return ctx.Err()
		}
		// Sealed: the write is in the batch and commits with it, or not.
		return <-o.done
	}
}

func (w *writer) loop() {
	defer close(w.done)
	defer func() {
		w.closeStmts()
		if w.conn != nil {
			_ = w.conn.Close()
		}
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

// defaultBatchTimeout bounds the statements of one batch. The ops' own
// contexts are not used for statements: cancelling one would interrupt the
// shared connection in the middle of another op's work, and an interrupted
// write makes SQLite roll the whole transaction back.
const defaultBatchTimeout = time.Minute

// errRolledBack is what the ops of a transaction that SQLite rolled back
// itself are told.
var errRolledBack = errors.New("SQLite rolled the write transaction back; nothing of it was written")

// run executes one batch and answers every op in it: in one transaction,
// or in several when SQLite rolls one back before the batch has run.
func (w *writer) run(batch []*op) {
	for len(batch) > 0 {
		batch = w.runTx(batch)
	}
}

// ran is an op run in the current transaction, with its outcome.
type ran struct {
	o     *op
	err   error
	notes []store.Notification
}

// runTx runs the ops of batch in one transaction and answers them. When
// SQLite rolls the transaction back before every op has run, it answers
// the ops run so far and returns the others, which have not run.
func (w *writer) runTx(batch []*op) (rest []*op) {
	batch = w.dropAbandoned(batch)
	if len(batch) == 0 {
		return nil
	}
	batch, err := w.begin(batch)
	if err != nil {
		for _, o := range batch {
			o.answer(err)
		}
		return nil
	}
	if len(batch) == 0 {
		return nil
	}
	budget := w.batchTimeout
	for _, o := range batch {
		budget = max(budget, o.budget)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	done := make([]ran, 0, len(batch))
	for i, o := range batch {
		if o.givenUp() {
			o.answer(o.ctx.Err())
			continue
		}
		tx := &wtx{conn: w.conn, ctx: ctx, stmts: w.stmts}
		err := w.runOne(tx, o)
		if w.rolledBack.Load() {
			// SQLite ended the transaction in the middle of the batch:
			// what ran before is gone with it. The ops not run yet go
			// on in a transaction of their own.
			cause := fmt.Errorf("%w (%w)", errRolledBack, err)
			if err == nil {
				cause = errRolledBack
			}
			for _, r := range done {
				r.o.answer(cause)
			}
			o.answer(cause)
			w.endTx()
			return batch[i+1:]
		}
		done = append(done, ran{o: o, err: err, notes: tx.notes})
	}
	w.prune(ctx)
	if err := w.commit(); err != nil {
		w.endTx()
		err = wrap(err, "commit")
		for _, r := range done {
			r.o.answer(err)
		}
		return nil
	}
	var notes []store.Notification
	for _, r := range done {
		if r.err == nil {
			notes = append(notes, r.notes...)
		}
	}
	w.s.deliver(notes)
	for _, r := range done {
		r.o.answer(r.err)
	}
	return nil
}

// dropAbandoned answers the ops whose callers have given up and returns
// the others.
func (w *writer) dropAbandoned(batch []*op) []*op {
	live := make([]*op, 0, len(batch))
	for _, o := range batch {
		if o.givenUp() {
			o.answer(o.ctx.Err())
			continue
		}
		live = append(live, o)
	}
	return live
}

// lockSlice is how long one attempt at the write lock waits for another
// process's transaction before the writer looks again at its ops: it takes
// in those sent meanwhile, answers those that may not wait, and drops those
// whose callers have given up.
//
// It is also all that an op that may not wait waits: every writer of the
// file takes the one lock, whatever rows it writes, and an ordinary
// transaction of another process ends well within it, while a lock held
// longer (an operator's open transaction, a frozen process) is the one that
// a move that may not wait must not stall on, as on PostgreSQL it must not
// stall on a locked row.
const lockSlice = 50 * time.Millisecond

// begin takes the write lock and opens the batch's transaction, and
// returns the batch's ops that are still to run. Ops that may not wait are
// answered store.ErrBusy once one slice of waiting has not got the lock,
// those sent while the writer waits for it included.
//
// The lock is waited for no longer than the busy timeout, nor than the
// most patient caller of the batch: a writer stuck behind another
// process's lock holds up every later op of this process too.
func (w *writer) begin(batch []*op) ([]*op, error) {
	started := time.Now()
	for {
		batch = w.dropAbandoned(batch)
		if len(batch) == 0 {
			return nil, nil
		}
		wait := w.lockWait(batch, started)
		noWait := slices.ContainsFunc(batch, func(o *op) bool { return o.noWait })
		err := w.beginWithin(min(wait, lockSlice))
		if err == nil || !errors.Is(err, store.ErrBusy) {
			return batch, err
		}
		if noWait {
			batch = slices.DeleteFunc(batch, func(o *op) bool {
				if o.noWait {
					o.answer(err)
				}
				return o.noWait
			})
			continue
		}
		if wait <= lockSlice {
			return batch, err
		}
		batch = w.gather(batch)
	}
}

// gather adds to batch the ops sent since it was taken, up to MaxBatch,
// without waiting for any.
func (w *writer) gather(batch []*op) []*op {
	for len(batch) < MaxBatch {
		select {
		case o := <-w.ops:
			batch = append(batch, o)
		default:
			return batch
		}
	}
	return batch
}

// beginWithin runs BEGIN IMMEDIATE with a busy timeout of wait.
func (w *writer) beginWithin(wait time.Duration) error {
	if err := w.connect(); err != nil {
		return err
	}
	ctx := context.Background() // the busy timeout bounds the wait
	if wait != w.busy {
		if _, err := w.conn.ExecContext(ctx, fmt.Sprintf(`PRAGMA busy_timeout = %d`, wait.Milliseconds())); err != nil {
			return wrap(err, "set the busy timeout")
		}
		w.busy = wait
	}
	if _, err := w.control(`BEGIN IMMEDIATE`); err != nil {
		return wrap(err, "begin a write")
	}
	w.rolledBack.Store(false)
	return nil
}

// commit commits the batch's transaction, the one commit the commit hook
// lets through.
func (w *writer) commit() error {
	w.committing.Store(true)
	defer w.committing.Store(false)
	_, err := w.control(`COMMIT`)
	return err
}

// endTx leaves the connection outside any transaction, so that it holds no
// lock of the file: a ROLLBACK, which fails harmlessly when SQLite has
// ended the transaction already. A connection that cannot roll back is
// closed, which releases its locks, and the writer takes a new one.
func (w *writer) endTx() {
	_, err := w.control(`ROLLBACK`)
	if err == nil || strings.Contains(err.Error(), "no transaction is active") {
		return
	}
	w.reconnect()
}

// reconnect closes the writer's connection, discarding it (SQLite releases
// a closed connection's locks, and its transaction with them), and takes a
// new one from the writer's pool, with the hooks registered.
func (w *writer) reconnect() {
	w.closeStmts()
	_ = w.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = w.conn.Close()
	w.conn = nil
	w.busy = -1 // unknown: set again at the next BEGIN
	_ = w.connect()
}

// closeStmts closes the writer's prepared statements and forgets them.
func (w *writer) closeStmts() {
	for _, st := range w.stmts {
		_ = st.Close()
	}
	clear(w.stmts)
}

// connect takes the writer's connection from its pool, if it has none,
// and registers its hooks.
func (w *writer) connect() error {
	if w.conn != nil {
		return nil
	}
	conn, err := w.db.Conn(context.Background())
	if err != nil {
		return wrap(err, "connect the writer")
	}
	err = conn.Raw(func(dc any) error {
		hooks, ok := dc.(sqlite.HookRegisterer)
		if !ok {
			return fmt.Errorf("the SQLite driver's connection (%T) takes no commit hook", dc)
		}
		hooks.RegisterCommitHook(func() int32 {
			if w.committing.Load() {
				return 0
			}
			return 1 // turns the commit into a rollback
		})
		hooks.RegisterRollbackHook(func() { w.rolledBack.Store(true) })
		return nil
	})
	if err != nil {
		_ = conn.Close()
		return err
	}
	w.conn = conn
	return nil
}

// control runs a statement that begins or ends a transaction or an op's
// savepoint: prepared once, and on no deadline, so that an op or a batch
// whose time is up is still undone, released or committed.
func (w *writer) control(query string) (sql.Result, error) {
	st := w.stmts[query]
	if st == nil {
		var err error
		if st, err = w.conn.PrepareContext(context.Background(), query); err != nil {
			return nil, err
		}
		w.stmts[query] = st
	}
	return st.ExecContext(context.Background())
}

// lockWait is how long the batch may still wait for the write lock, having
// waited since started: the busy timeout, cut to the latest deadline among
// the ops whose callers still wait, in whole milliseconds.
func (w *writer) lockWait(batch []*op, started time.Time) time.Duration {
	var latest time.Time
	unbounded := false
	for _, o := range batch {
		d, ok := o.ctx.Deadline()
		if !ok {
			unbounded = true
		} else if d.After(latest) {
			latest = d
		}
	}
	wait := w.maxBusy - time.Since(started)
	if !unbounded {
		wait = min(wait, time.Until(latest))
	}
	// Whole milliseconds, rounded up, so that the setting changes only
	// when the callers' deadlines do by a millisecond or more.
	return max(0, (wait + time.Millisecond - 1).Truncate(time.Millisecond))
}

// runOne runs one op under a savepoint, with its notifications written to
// the outbox in the same savepoint. An op that fails, or whose caller has
// abandoned it by the time it has run, is undone.
func (w *writer) runOne(tx *wtx, o *op) error {
	if _, err := w.control(`SAVEPOINT op`); err != nil {
		return wrap(err, "savepoint")
	}
	err := tx.run(o.fn, w.s.origin)
	if w.afterOp != nil {
		w.afterOp(o)
	}
	if err == nil && !o.seal() {
		err = o.ctx.Err()
	}
	if err != nil {
		if _, rerr := w.control(`ROLLBACK TO op`); rerr != nil {
			return fmt.Errorf("%w; and undoing it: %w", err, translate(rerr))
		}
	}
	if _, rerr := w.control(`RELEASE op`); rerr != nil && err == nil {
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
	if _, err := w.control(`SAVEPOINT prune`); err != nil {
		return
	}
	_, err := w.conn.ExecContext(ctx, `DELETE FROM flotilla_notifications WHERE at < `+nowSQL+` - ?`,
		outboxRetention.Microseconds())
	if err != nil {
		_, _ = w.control(`ROLLBACK TO prune`)
	}
	_, _ = w.control(`RELEASE prune`)
}
