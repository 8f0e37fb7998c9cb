package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	sqlite "modernc.org/sqlite"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// writerBundle is a migrated store and, for the tests that build a batch
// by hand, a second writer on the same file, not started: the test runs
// its batches itself, in the order it gives.
type writerBundle struct {
	t    *testing.T
	ctx  context.Context
	s    *Store
	path string
}

func setupWriter(t *testing.T) *writerBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	path := filepath.Join(t.TempDir(), "flotilla.db")
	s, err := New(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx, 8); err != nil {
		t.Fatal(err)
	}
	return &writerBundle{t: t, ctx: ctx, s: s, path: path}
}

// handWriter is a writer of its own on the bundle's file, whose batches
// the test runs by calling run.
func (b *writerBundle) handWriter() *writer {
	b.t.Helper()
	db := openDB(b.path, time.Minute, readWrite)
	db.SetMaxOpenConns(1)
	w, err := newWriter(b.s, db, time.Minute)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() {
		w.closeStmts()
		if w.conn != nil {
			_ = w.conn.Close()
		}
		_ = db.Close()
	})
	return w
}

// newOp is an op as write sends it.
func newOp(ctx context.Context, fn func(tx *wtx) error) *op {
	return &op{ctx: ctx, fn: fn, done: make(chan error, 1)}
}

// insertOp creates one queued task holding unique key.
func insertOp(ctx context.Context, uniqueKey string) *op {
	return newOp(ctx, func(tx *wtx) error {
		_, err := insertTasks(tx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1, UniqueKey: uniqueKey}}, false)
		return err
	})
}

// holds reports whether a task holds unique key.
func (b *writerBundle) holds(uniqueKey string) bool {
	b.t.Helper()
	var n int
	if err := b.s.rdb.QueryRowContext(b.ctx, `SELECT count(*) FROM flotilla_tasks WHERE unique_key = ?`, uniqueKey).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n > 0
}

// mustTellTheTruth fails the test unless o's caller was told success
// exactly when its task exists.
func (b *writerBundle) mustTellTheTruth(name string, o *op, uniqueKey string) error {
	b.t.Helper()
	err := <-o.done
	if written := b.holds(uniqueKey); written != (err == nil) {
		b.t.Errorf("op %s was answered %v, but its task written: %v", name, err, written)
	}
	return err
}

// lockIsFree fails the test unless another connection can take the file's
// write lock at once: no connection was left inside a transaction.
func (b *writerBundle) lockIsFree() {
	b.t.Helper()
	db, err := sql.Open("sqlite", "file:"+b.path+"?_pragma=busy_timeout(2000)")
	if err != nil {
		b.t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(b.ctx, `BEGIN IMMEDIATE; ROLLBACK`); err != nil {
		b.t.Fatalf("another connection cannot take the write lock: %v", err)
	}
}

type callerMark struct{}

// A claim whose caller gives up while the claim runs in its batch must not
// commit: the caller was told it failed, and a task claimed for nobody
// would sit running until its lease lapsed, its attempt spent.
func TestAClaimWhoseCallerGaveUpWhileItRanIsUndone(t *testing.T) {
	b := setupWriter(t)
	created, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}})
	if err != nil {
		t.Fatal(err)
	}
	held, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{Owner: "a", Node: "a", Buckets: bucket.Of(1), TTL: time.Minute})
	if err != nil || len(held) != 1 || !held[0].Held {
		t.Fatalf("acquire bucket 1: %v %v", held, err)
	}
	ctx, giveUp := context.WithCancel(context.WithValue(b.ctx, callerMark{}, true))
	defer giveUp()
	returned := make(chan error, 1)
	heard := make(chan error, 1)
	b.s.w.afterOp = func(o *op) {
		if o.ctx.Value(callerMark{}) != nil {
			// The claim has run in the batch; its caller gives up
			// before the batch commits, and hears of it.
			giveUp()
			heard <- <-returned
		}
	}
	go func() {
		_, err := b.s.ClaimTasks(ctx, store.ClaimRequest{Owner: "a", Node: "a",
			Buckets: []store.HeldBucket{{Bucket: 1, Epoch: held[0].Epoch}}, Kinds: []string{"noop"}, Limit: 1, LeaseTTL: time.Minute})
		returned <- err
	}()
	var answer error
	select {
	case answer = <-heard:
	case <-b.ctx.Done():
		t.Fatal("the claim never ran")
	}
	// A write after the claim's batch: by then that batch has committed,
	// whatever it held.
	if err := b.s.write(b.ctx, func(*wtx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(answer, context.Canceled) {
		t.Fatalf("the claim's caller was told %v, want context.Canceled", answer)
	}
	got, err := b.s.GetTask(b.ctx, created[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != task.Queued || got.Attempt != 0 || got.ClaimSeq != 0 {
		t.Errorf("the claim its caller gave up on was committed: task %s, attempt %d, claim seq %d",
			got.Status, got.Attempt, got.ClaimSeq)
	}
}

// interruptNext cancels the context of the statement that calls the SQL
// function flotilla_test_interrupt(), which interrupts it in SQLite.
var (
	interruptOnce sync.Once
	interruptMu   sync.Mutex
	interruptNext context.CancelFunc
)

func registerInterrupt(t *testing.T) {
	t.Helper()
	interruptOnce.Do(func() {
		sqlite.MustRegisterScalarFunction("flotilla_test_interrupt", 0,
			func(*sqlite.FunctionContext, []driver.Value) (driver.Value, error) {
				interruptMu.Lock()
				defer interruptMu.Unlock()
				if interruptNext != nil {
					interruptNext()
				}
				return int64(1), nil
			})
	})
}

// SQLite rolls the whole transaction back when a write inside it is
// interrupted (as on a full disk or an I/O error). The ops of the batch
// that ran before are gone with it, and must be told so; those after it
// must not commit one by one outside any transaction, and their callers
// must hear the truth too.
func TestABatchThatSQLiteRolledBackTellsEveryCallerTheTruth(t *testing.T) {
	registerInterrupt(t)
	b := setupWriter(t)
	w := b.handWriter()
	before := insertOp(b.ctx, "before")
	interrupted := newOp(b.ctx, func(tx *wtx) error {
		ctx, cancel := context.WithCancel(tx.ctx)
		defer cancel()
		interruptMu.Lock()
		interruptNext = cancel
		interruptMu.Unlock()
		// An endless insert: only the interrupt ends it.
		_, err := tx.conn.ExecContext(ctx, `INSERT INTO flotilla_notifications (topic, payload, origin, at)
			SELECT 'test', flotilla_test_interrupt(), 'test', n
			FROM (WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT n FROM c)`)
		if err == nil {
			return errors.New("the endless insert ended without an interrupt")
		}
		return err
	})
	after := insertOp(b.ctx, "after")
	w.run([]*op{before, interrupted, after})

	if err := b.mustTellTheTruth("before", before, "before"); err == nil {
		t.Errorf("the op before the interrupt was told it committed, though SQLite rolled its transaction back")
	}
	if err := <-interrupted.done; err == nil {
		t.Errorf("the interrupted op was told it committed")
	}
	if err := b.mustTellTheTruth("after", after, "after"); err != nil {
		t.Errorf("the op after the interrupt, run in a transaction of its own, failed: %v", err)
	}
	b.lockIsFree()
}

// A batch whose statements outlive its time: the writer's connection must
// not be left inside the transaction, holding the file's write lock, and
// every caller is told the truth.
func TestABatchThatOutlivesItsTimeLeavesNoTransactionOpen(t *testing.T) {
	b := setupWriter(t)
	w := b.handWriter()
	w.batchTimeout = 200 * time.Millisecond
	first := insertOp(b.ctx, "first")
	slow := newOp(b.ctx, func(tx *wtx) error {
		<-tx.ctx.Done() // the batch's time is up
		return nil
	})
	late := insertOp(b.ctx, "late")
	w.run([]*op{first, slow, late})
	b.mustTellTheTruth("first", first, "first")
	<-slow.done
	if err := b.mustTellTheTruth("late", late, "late"); err == nil {
		t.Errorf("an op run after its batch's time was up was told it committed")
	}
	b.lockIsFree()

	// The writer goes on with its next batch.
	w.batchTimeout = time.Minute
	next := insertOp(b.ctx, "next")
	w.run([]*op{next})
	if err := b.mustTellTheTruth("next", next, "next"); err != nil {
		t.Errorf("the batch after: %v", err)
	}
}
