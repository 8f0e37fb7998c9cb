package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/sqlite"
	"github.com/flotilla-dev/flotilla/task"
)

type testBundle struct {
	t    *testing.T
	path string
	s    *sqlite.Store
	ctx  context.Context
}

func setup(t *testing.T, opts ...sqlite.Option) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	path := filepath.Join(t.TempDir(), "flotilla.db")
	s := open(t, path, opts...)
	if _, err := s.Migrate(ctx, 8); err != nil {
		t.Fatal(err)
	}
	return &testBundle{t: t, path: path, s: s, ctx: ctx}
}

// running creates a task in bucket 1 and claims it for owner "a".
func (b *testBundle) running() *task.Task {
	b.t.Helper()
	if _, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}}); err != nil {
		b.t.Fatal(err)
	}
	leases, err := b.s.AcquireBuckets(b.ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(1), TTL: time.Minute})
	if err != nil || !leases[0].Held {
		b.t.Fatalf("acquire: %v %+v", err, leases)
	}
	claimed, err := b.s.ClaimTasks(b.ctx, store.ClaimRequest{Owner: "a", Node: "n", Kinds: []string{"noop"}, Limit: 1,
		LeaseTTL: time.Minute, Buckets: []store.HeldBucket{{Bucket: 1, Epoch: leases[0].Epoch}}})
	if err != nil || len(claimed) != 1 {
		b.t.Fatalf("claim: %v %d", err, len(claimed))
	}
	return claimed[0]
}

// holdWriteLock opens a write transaction on another connection, as
// another process (or an operator's sqlite3 shell) would, until release.
func holdWriteLock(t *testing.T, path string) (release func()) {
	t.Helper()
	db := rawDB(t, path)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, _ = conn.ExecContext(context.Background(), `ROLLBACK`)
			_ = conn.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// TestAnotherProcessHoldingTheWriteLock: SQLite locks the file, not a row.
// While another connection holds the write lock past the busy timeout, a
// renewal answers every attempt busy (neither renewed nor lost) and a move
// fails with store.ErrBusy; once the lock is gone both work.
func TestAnotherProcessHoldingTheWriteLock(t *testing.T) {
	b := setup(t, sqlite.WithBusyTimeout(100*time.Millisecond))
	running := b.running()

	release := holdWriteLock(t, b.path)
	ren, err := b.s.RenewTaskLeases(b.ctx, "a", []task.Ref{running.Ref()}, 2*time.Minute)
	if err != nil {
		t.Fatalf("renewal under another's write lock: %v", err)
	}
	if len(ren.Busy) != 1 || len(ren.Renewed) != 0 {
		t.Fatalf("renewal under another's write lock: %+v, want the attempt busy", ren)
	}
	_, err = b.s.Transition(b.ctx, store.Transition{ID: running.ID, Version: running.StatusVersion, To: task.Retrying, NoWait: true})
	if !errors.Is(err, store.ErrBusy) {
		t.Fatalf("a move under another's write lock: %v, want store.ErrBusy", err)
	}
	release()

	ren, err = b.s.RenewTaskLeases(b.ctx, "a", []task.Ref{running.Ref()}, 2*time.Minute)
	if err != nil || len(ren.Renewed) != 1 {
		t.Fatalf("renewal once the lock is gone: %+v %v", ren, err)
	}
}

// TestNotificationsReachAnotherProcess: a second handle on the file (a
// second process) hears of new tasks through the outbox.
func TestNotificationsReachAnotherProcess(t *testing.T) {
	b := setup(t)
	other := open(t, b.path, sqlite.WithOutboxPoll(5*time.Millisecond))
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	sub, err := other.Listen(ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 6}}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-sub.C():
		if n.Topic != store.TopicTasks || n.Payload != "6" {
			t.Fatalf("notification %+v, want tasks in bucket 6", n)
		}
	case <-time.After(patience.Scale(30 * time.Second)):
		t.Fatal("no notification from the other process")
	}
}

// TestOwnNotificationsAreNotDeliveredTwice: a handle's listeners hear of
// its own writes at commit, and the outbox poll does not repeat them.
func TestOwnNotificationsAreNotDeliveredTwice(t *testing.T) {
	b := setup(t, sqlite.WithOutboxPoll(time.Millisecond))
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	sub, err := b.s.Listen(ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 2}}); err != nil {
		t.Fatal(err)
	}
	<-sub.C()
	// A marker written by another handle after the first: once it arrives
	// the poller has read past the first row, and a repeat would have come
	// before it.
	other := open(t, b.path)
	if _, err := other.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 7}}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-sub.C():
		if n.Payload != "7" {
			t.Fatalf("after the handle's own notification came %+v again, want the other handle's bucket 7", n)
		}
	case <-time.After(patience.Scale(30 * time.Second)):
		t.Fatal("no notification from the other handle")
	}
}

// TestGroupCommitKeepsOpsApart: many writers at once share commits, and
// one op's failure (a duplicate unique key) undoes that op alone.
func TestGroupCommitKeepsOpsApart(t *testing.T) {
	b := setup(t)
	const n = 200
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1, UniqueKey: fmt.Sprintf("u%d", i)}}
			if i%10 == 0 {
				// Its first task is written before the second fails: the
				// failure must take the first with it.
				batch = append(batch, store.NewTask{Kind: "noop", Key: "k", Bucket: 1, UniqueKey: "shared"})
			}
			_, errs[i] = b.s.CreateTasks(b.ctx, batch)
		}()
	}
	wg.Wait()
	created, dup := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			created++
		case errors.Is(err, store.ErrDuplicate):
			dup++
		default:
			t.Fatalf("submit %d: %v", i, err)
		}
	}
	if want := n - n/10 + 1; created != want || dup != n/10-1 {
		t.Fatalf("%d created and %d duplicates, want %d and %d", created, dup, want, n/10-1)
	}
	all, err := b.s.ListTasks(b.ctx, store.TaskFilter{Limit: 1000})
	if want := n - n/10 + 2; err != nil || len(all) != want {
		t.Fatalf("listed %d tasks (%v), want %d", len(all), err, want)
	}
}

// TestBadPath: a path the store cannot use is refused, naming it.
func TestBadPath(t *testing.T) {
	for _, path := range []string{"", "a.db?mode=ro"} {
		if _, err := sqlite.New(context.Background(), path); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("New(%q): %v, want store.ErrInvalid", path, err)
		}
	}
	_, err := sqlite.New(context.Background(), filepath.Join(t.TempDir(), "no", "such", "dir", "f.db"))
	if err == nil {
		t.Error("a file in a directory that does not exist was opened")
	}
}

// A move that may not wait (reconcile's) does not stall behind another
// process's lock on the file either, however long the busy timeout: it
// fails with store.ErrBusy after a moment, and a write that may wait still
// waits.
func TestAMoveThatMayNotWaitDoesNotWaitForAnotherProcesssLock(t *testing.T) {
	b := setup(t, sqlite.WithBusyTimeout(time.Hour))
	running := b.running()
	release := holdWriteLock(t, b.path)

	patient := make(chan error, 1)
	go func() {
		_, err := b.s.CreateTasks(context.Background(), []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}})
		patient <- err
	}()
	moved := make(chan error, 1)
	go func() {
		// No deadline: only the busy timeout, an hour, bounds a wait.
		_, err := b.s.Transition(context.Background(), store.Transition{ID: running.ID, Version: running.StatusVersion,
			To: task.Retrying, NoWait: true})
		moved <- err
	}()
	select {
	case err := <-moved:
		if !errors.Is(err, store.ErrBusy) {
			t.Errorf("a move that may not wait, under another's write lock: %v, want store.ErrBusy", err)
		}
	case <-time.After(30 * time.Second):
		release()
		<-moved
		t.Fatal("a move that may not wait waited for another process's write lock")
	}
	select {
	case err := <-patient:
		t.Fatalf("a write that may wait ended under another's write lock: %v", err)
	default:
	}
	release()
	if err := <-patient; err != nil {
		t.Fatalf("a write that waited for the lock: %v", err)
	}
	if got, err := b.s.GetTask(b.ctx, running.ID); err != nil || got.Status != task.Running {
		t.Fatalf("the refused move changed the task: %v %v", got, err)
	}
}

// The file named is the file opened: SQLite reads a URI's path with %XX
// escapes decoded, and the store's path must not be read so.
func TestTheFileNamedIsTheFileOpened(t *testing.T) {
	for _, name := range []string{"jobs%41.db", "a%2fb.db", "100%.db", "%%.db", "sp ace é.db"} {
		dir := t.TempDir()
		path := filepath.Join(dir, name)
		s := open(t, path)
		if s.Path() != path {
			t.Errorf("New(%q).Path() = %q", path, s.Path())
		}
		if _, err := s.Migrate(context.Background(), 8); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		s.Close()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), name) {
				t.Errorf("opening %q made %q", name, e.Name())
			}
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("opening %q did not make it: %v", name, err)
		}
	}
}

// The database, its -wal and its -shm hold every payload and result: the
// store creates them readable by their owner only, whatever the umask, and
// ReadableByOthers names an older file that others may read.
func TestTheFilesAreTheOwnersAlone(t *testing.T) {
	b := setup(t)
	if _, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{b.path, b.path + "-wal", b.path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != sqlite.FileMode {
			t.Errorf("%s has mode %v, want %v", filepath.Base(p), perm, sqlite.FileMode)
		}
	}
	if open := sqlite.ReadableByOthers(b.path); len(open) != 0 {
		t.Errorf("ReadableByOthers of a new store: %v", open)
	}
	if err := os.Chmod(b.path, 0o644); err != nil {
		t.Fatal(err)
	}
	if open := sqlite.ReadableByOthers(b.path); len(open) != 1 || !strings.Contains(open[0], b.path) {
		t.Errorf("ReadableByOthers of a file made 0644: %v, want it named", open)
	}
}

// A store opened read-only creates no file, writes nothing to one, and
// reads what a writing handle committed.
func TestAReadOnlyStoreWritesNothing(t *testing.T) {
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), "flotilla.db")
	_, err := sqlite.New(ctx, missing, sqlite.ReadOnly())
	var noFile *sqlite.NoFileError
	if !errors.As(err, &noFile) || noFile.Path != missing || !errors.Is(err, store.ErrSchema) {
		t.Errorf("a read-only store on a missing file: %v, want a NoFileError naming it", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a read-only store created the file: %v", err)
	}

	empty := filepath.Join(t.TempDir(), "zero.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ro := open(t, empty, sqlite.ReadOnly())
	if _, err := ro.Meta(ctx); !errors.Is(err, store.ErrSchema) {
		t.Errorf("Meta of an empty file: %v, want store.ErrSchema", err)
	}
	if _, err := ro.Migrate(ctx, 8); !errors.Is(err, sqlite.ErrReadOnly) {
		t.Errorf("Migrate of a read-only store: %v, want sqlite.ErrReadOnly", err)
	}
	ro.Close()
	if fi, err := os.Stat(empty); err != nil || fi.Size() != 0 {
		t.Errorf("an empty file read read-only is now %v bytes (%v)", fi.Size(), err)
	}

	b := setup(t)
	created, err := b.s.CreateTasks(b.ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}})
	if err != nil {
		t.Fatal(err)
	}
	reader := open(t, b.path, sqlite.ReadOnly())
	if got, err := reader.GetTask(ctx, created[0].ID); err != nil || got.ID != created[0].ID {
		t.Errorf("a read-only handle reads the writer's task: %v %v", got, err)
	}
	if _, err := reader.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}}); !errors.Is(err, sqlite.ErrReadOnly) {
		t.Errorf("a write through a read-only handle: %v, want sqlite.ErrReadOnly", err)
	}
}
