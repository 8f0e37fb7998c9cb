package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// testTimeout bounds every test's database work; generous for a loaded
// machine under -race.
const testTimeout = 2 * time.Minute

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// migrated opens a store on a fresh database migrated with numBuckets.
func migrated(t testing.TB, numBuckets int, opts ...postgres.Option) *postgres.Store {
	t.Helper()
	s := open(t, testdb.New(t), opts...)
	if _, err := s.Migrate(testContext(t), numBuckets); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

func queryValue[T any](t testing.TB, s *postgres.Store, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := s.Pool().QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// receive waits for a notification on topic, skipping others, until the
// deadline.
func receive(t *testing.T, sub store.Subscription, topic store.Topic, within time.Duration) store.Notification {
	t.Helper()
	within = patience.Scale(within)
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		select {
		case n, open := <-sub.C():
			if !open {
				t.Fatalf("subscription closed while waiting for %s", topic)
			}
			if n.Topic == topic {
				return n
			}
		case <-timeout.C:
			t.Fatalf("no %s notification within %v", topic, within)
		}
	}
}

func TestMigrateConcurrentlyOnAFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dsn := testdb.New(t)
	stores := []*postgres.Store{open(t, dsn), open(t, dsn), open(t, dsn)}

	var wg sync.WaitGroup
	metas := make([]store.Meta, len(stores))
	errs := make([]error, len(stores))
	start := make(chan struct{})
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			metas[i], errs[i] = s.Migrate(ctx, 32)
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Migrate %d: %v", i, err)
		}
		if metas[i].NumBuckets != 32 || metas[i].SchemaVersion != postgres.SchemaVersion || !metas[i].CreatedAt.Equal(metas[0].CreatedAt) {
			t.Errorf("Migrate %d answered %+v, want the fleet of 32 buckets that %+v describes", i, metas[i], metas[0])
		}
	}
	s := stores[0]
	if n := queryValue[int64](t, s, `SELECT count(*) FROM flotilla_schema_migrations`); n != postgres.SchemaVersion {
		t.Errorf("%d migration rows, want %d", n, postgres.SchemaVersion)
	}
	if n := queryValue[int64](t, s, `SELECT count(*) FROM flotilla_meta`); n != 1 {
		t.Errorf("%d meta rows, want 1", n)
	}
	if n := queryValue[int64](t, s, `SELECT count(*) FROM flotilla_bucket_leases`); n != 32 {
		t.Errorf("%d bucket leases, want 32", n)
	}
	if _, err := s.Migrate(ctx, -1); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Migrate(-1): %v, want store.ErrInvalid", err)
	}
}

func TestMetaOfAnOlderSchemaAsksForMigrate(t *testing.T) {
	t.Parallel()
	s := migrated(t, 8)
	if _, err := s.Pool().Exec(context.Background(), `DELETE FROM flotilla_schema_migrations`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(context.Background(), `INSERT INTO flotilla_schema_migrations (version) VALUES (0)`); err != nil {
		t.Fatal(err)
	}
	_, err := s.Meta(testContext(t))
	var se *store.SchemaError
	if !errors.As(err, &se) || se.Database != 0 || !strings.Contains(err.Error(), "flotilla.Migrate") {
		t.Errorf("Meta with no applied migration: %v, want a SchemaError naming flotilla.Migrate", err)
	}
}

func TestCreateTasksTx(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := migrated(t, 8)
	sub, err := s.Listen(ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	// Rolled back: nothing is left and nothing is announced.
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	created, err := s.CreateTasksTx(ctx, tx, []store.NewTask{{Kind: "noop", Key: "a", Bucket: 1}})
	if err != nil || len(created) != 1 {
		t.Fatalf("CreateTasksTx: %v %v", created, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetTask(ctx, created[0].ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a task of a rolled-back transaction: %v, want store.ErrNotFound", err)
	}

	// Committed: visible, and announced. Notifications arrive in commit
	// order, so the first one must be this one's, not the rolled-back one's.
	var committed []*task.Task
	err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE caller_rows (id int)`); err != nil {
			return err
		}
		committed, err = s.CreateTasksTx(ctx, tx, []store.NewTask{
			{Kind: "noop", Key: "b", Bucket: 2}, {Kind: "noop", Key: "c", Bucket: 3},
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range committed {
		if got, err := s.GetTask(ctx, c.ID); err != nil || got.Status != task.Queued {
			t.Errorf("committed task %d: %v %v", c.ID, got, err)
		}
	}
	if n := receive(t, sub, store.TopicTasks, 30*time.Second); n.Payload != "2-3" {
		t.Errorf("first notification %q, want 2-3 (the committed batch)", n.Payload)
	}

	// The bulk path inside a caller's transaction, rolled back.
	tx, err = s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bulk, err := s.CreateTasksTx(ctx, tx, batchOf(600, 4))
	if err != nil || len(bulk) != 600 {
		t.Fatalf("CreateTasksTx of 600: %d %v", len(bulk), err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryValue[int64](t, s, `SELECT count(*) FROM flotilla_tasks`); n != 2 {
		t.Errorf("%d tasks after a rolled-back bulk insert, want the 2 committed", n)
	}
}

// future is the RunAt of batchOf's tasks that are due later.
var future = time.Now().Add(48 * time.Hour).Truncate(time.Second)

// batchOf makes n tasks of every shape: queued, delayed, future RunAt, past
// RunAt, pending, with and without payload, unique key and schedule.
func batchOf(n int, seed int) []store.NewTask {
	past := time.Now().Add(-48 * time.Hour)
	tick := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	out := make([]store.NewTask, n)
	for i := range out {
		nt := store.NewTask{
			Kind: fmt.Sprintf("kind-%d", i%3), Key: fmt.Sprintf("key-%d", i), Bucket: (i + seed) % 8,
			Priority: i % 5, MaxAttempts: i % 4, Timeout: time.Duration(i%7) * time.Second,
		}
		switch i % 6 {
		case 0:
			nt.Payload = json.RawMessage(fmt.Sprintf(`{"i": %d, "s": "x"}`, i))
		case 1:
			nt.Delay = time.Hour
		case 2:
			nt.RunAt = future
		case 3:
			nt.RunAt = past
			nt.Payload = json.RawMessage(`[1,2,3]`)
		case 4:
			nt.Pending = true
			nt.UniqueKey = fmt.Sprintf("unique-%d-%d", seed, i)
		case 5:
			nt.Schedule, nt.ScheduledFor = fmt.Sprintf("sched-%d", seed), tick.Add(time.Duration(i)*time.Minute)
		}
		out[i] = nt
	}
	return out
}

// sameTask compares two reads of a task, with payloads compared as JSON.
func sameTask(t *testing.T, what string, got, want *task.Task) {
	t.Helper()
	g, w := *got, *want
	if !jsonEqual(g.Payload, w.Payload) {
		t.Errorf("%s: task %d payload %s, want %s", what, w.ID, g.Payload, w.Payload)
	}
	g.Payload, w.Payload = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s: task %d\n got %+v\nwant %+v", what, w.ID, g, w)
	}
}

func jsonEqual(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

func TestInsertAndCopyPathsAgree(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dsn := testdb.New(t)
	s := open(t, dsn)
	if _, err := s.Migrate(ctx, 8); err != nil {
		t.Fatal(err)
	}
	// Listening as another process does: the creating store's own
	// subscriptions also hear of small batches in-process, a second time.
	sub, err := open(t, dsn).Listen(ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	small, err := s.CreateTasks(ctx, batchOf(12, 0)) // INSERT ... unnest
	if err != nil {
		t.Fatal(err)
	}
	large, err := s.CreateTasks(ctx, batchOf(612, 1)) // COPY
	if err != nil {
		t.Fatal(err)
	}
	for name, created := range map[string][]*task.Task{"insert": small, "copy": large} {
		for i, c := range created {
			if i > 0 && c.ID <= created[i-1].ID {
				t.Fatalf("%s: ids not ascending in input order at %d", name, i)
			}
			got, err := s.GetTask(ctx, c.ID)
			if err != nil {
				t.Fatal(err)
			}
			sameTask(t, name+" path, returned vs stored", c, got)
		}
	}
	// The same input row gives the same task by either path, apart from
	// its id, bucket (seeded differently) and creation time.
	for i := range small {
		a, b := *small[i], *large[i]
		for _, x := range []*task.Task{&a, &b} {
			x.ID, x.Bucket, x.CreatedAt, x.UpdatedAt, x.Schedule, x.UniqueKey = 0, 0, time.Time{}, time.Time{}, "", ""
			if !x.RunAt.Equal(future) {
				x.RunAt = time.Time{} // now, or now + Delay: read at different times
			}
		}
		sameTask(t, fmt.Sprintf("input %d, insert vs copy", i), &b, &a)
	}
	statuses := map[task.Status]int{}
	for _, c := range large {
		statuses[c.Status]++
	}
	if statuses[task.Queued] != 306 || statuses[task.Scheduled] != 204 || statuses[task.Pending] != 102 {
		t.Errorf("copy path statuses %v", statuses)
	}
	if s := large[0]; s.MaxAttempts != store.DefaultMaxAttempts || s.StatusVersion != 1 {
		t.Errorf("copy path defaults: %+v", s)
	}

	// Both paths announce the buckets of their due tasks once.
	for _, created := range [][]*task.Task{small, large} {
		var due []int
		for _, c := range created {
			if c.Status == task.Queued {
				due = append(due, c.Bucket)
			}
		}
		want := bucket.Of(due...).String()
		if n := receive(t, sub, store.TopicTasks, 30*time.Second); n.Payload != want {
			t.Errorf("notification %q, want %q", n.Payload, want)
		}
	}

	// Both paths name a unique key that is taken, and leave nothing behind.
	before := queryValue[int64](t, s, `SELECT count(*) FROM flotilla_tasks`)
	for _, n := range []int{3, 700} {
		batch := batchOf(n, 9)
		batch[len(batch)-1].UniqueKey = "unique-0-4"
		_, err := s.CreateTasks(ctx, batch)
		if !errors.Is(err, store.ErrDuplicate) || !strings.Contains(err.Error(), "unique-0-4") {
			t.Errorf("batch of %d with a taken unique key: %v, want store.ErrDuplicate naming it", n, err)
		}
	}
	if after := queryValue[int64](t, s, `SELECT count(*) FROM flotilla_tasks`); after != before {
		t.Errorf("refused batches left %d tasks", after-before)
	}

	// A bucket the fleet does not have is refused before any write.
	_, err = s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Bucket: 8}})
	if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "bucket 8") {
		t.Errorf("a task for bucket 8 of 8: %v, want store.ErrInvalid naming the bucket", err)
	}
}

func TestListenSurvivesATerminatedConnection(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dsn := testdb.New(t)
	s := open(t, dsn)
	if _, err := s.Migrate(ctx, 8); err != nil {
		t.Fatal(err)
	}
	sub, err := s.Listen(ctx, store.TopicTasks, store.TopicBuckets)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// Tasks are created through another store, as by another process: a
	// store's own subscriptions hear of its tasks without the server, and
	// only the server's delivery tells whether the connection is back.
	writer := open(t, dsn)

	if _, err := writer.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Bucket: 6}}); err != nil {
		t.Fatal(err)
	}
	if n := receive(t, sub, store.TopicTasks, 30*time.Second); n.Payload != "6" {
		t.Errorf("payload %q, want 6", n.Payload)
	}

	listener := `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %'`
	pid := queryValue[int32](t, s, listener)
	if !queryValue[bool](t, s, `SELECT pg_terminate_backend($1)`, pid) {
		t.Fatalf("could not terminate the listener (pid %d)", pid)
	}

	// Once it listens again it says so for each topic, as nothing sent
	// meanwhile reached it.
	resumed := map[store.Topic]bool{}
	for len(resumed) < 2 {
		select {
		case n, open := <-sub.C():
			if !open {
				t.Fatal("the subscription ended when its connection was terminated")
			}
			if !n.Resumed || n.Payload != "" {
				t.Fatalf("before the resumed notes: %+v", n)
			}
			resumed[n.Topic] = true
		case <-time.After(patience.Scale(60 * time.Second)):
			t.Fatalf("no resumed note for every topic after the connection was terminated (got %v; Err: %v)",
				resumed, sub.(postgres.Subscription).Err())
		}
	}
	if !resumed[store.TopicTasks] || !resumed[store.TopicBuckets] {
		t.Errorf("resumed notes for %v, want tasks and buckets", resumed)
	}

	// Notifications sent while it reconnects are lost; keep creating tasks
	// until one arrives, as a consumer's polling would.
	deadline := time.Now().Add(patience.Scale(60 * time.Second))
	for {
		if _, err := writer.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Bucket: 7}}); err != nil {
			t.Fatal(err)
		}
		select {
		case n, open := <-sub.C():
			if !open {
				t.Fatal("the subscription ended when its connection was terminated")
			}
			if n.Topic != store.TopicTasks || n.Payload != "7" {
				t.Fatalf("after reconnecting: %+v", n)
			}
		case <-time.After(200 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatalf("no notification after the connection was terminated (Err: %v)", sub.(postgres.Subscription).Err())
			}
			continue
		}
		break
	}
	if err := sub.(postgres.Subscription).Err(); err != nil {
		t.Errorf("Err after reconnecting: %v", err)
	}
	if newPID := queryValue[int32](t, s, listener); newPID == pid {
		t.Errorf("the listener still has pid %d", pid)
	}

	// Close ends it: the channel closes and the connection goes away.
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	for range sub.C() {
	}
	if err := sub.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCloseEndsSubscriptions(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	s, err := postgres.New(testContext(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := s.Listen(context.Background(), store.TopicCommands)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	for range sub.C() {
	}
	if _, err := s.Listen(context.Background(), store.TopicCommands); err == nil {
		t.Error("Listen after Close succeeded")
	}
}

func TestUnreachableDatabaseFailsFastWithoutThePassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://u:secret@127.0.0.1:1/x",
		"host=127.0.0.1 port=1 user=u password=secret dbname=x",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		s, err := postgres.New(ctx, dsn)
		cancel()
		if err == nil {
			s.Close()
			t.Fatalf("New(%q) connected", dsn)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("error holds the password: %v", err)
		}
		if !strings.Contains(err.Error(), "cannot reach PostgreSQL at 127.0.0.1:1/x") {
			t.Errorf("error %q does not say which server could not be reached", err)
		}
		if d := time.Since(start); d > 15*time.Second {
			t.Errorf("took %v to fail", d)
		}
	}
	_, err := postgres.New(context.Background(), "postgres://u:secret@127.0.0.1:1/x?sslmode=bogus")
	if err == nil || strings.Contains(err.Error(), "secret") || !errors.Is(err, store.ErrInvalid) {
		t.Errorf("a DSN that does not parse: %v, want store.ErrInvalid without the password", err)
	}
}

func TestConnectionSettings(t *testing.T) {
	t.Parallel()
	s := open(t, testdb.New(t), postgres.WithStatementTimeout(1500*time.Millisecond), postgres.WithMaxConns(3))
	for setting, want := range map[string]string{
		"plan_cache_mode":   "force_custom_plan",
		"application_name":  "flotilla",
		"statement_timeout": "1500ms",
	} {
		if got := queryValue[string](t, s, "SELECT current_setting($1)", setting); got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	if got := s.Pool().Config().MaxConns; got != 3 {
		t.Errorf("MaxConns = %d, want 3", got)
	}
	def := open(t, testdb.New(t))
	if got := def.Pool().Config().MaxConns; got != postgres.DefaultMaxConns {
		t.Errorf("default MaxConns = %d, want %d", got, postgres.DefaultMaxConns)
	}
	if got := queryValue[string](t, def, "SHOW statement_timeout"); got != "0" {
		t.Errorf("default statement_timeout = %q, want 0", got)
	}
}

func TestAdvanceActiveSameTaskTwiceInOneBatch(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := migrated(t, 8)
	if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Bucket: 1}}); err != nil {
		t.Fatal(err)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(1), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "a", Node: "n", Kinds: []string{"noop"}, Limit: 1,
		LeaseTTL: time.Minute, Buckets: []store.HeldBucket{{Bucket: 1, Epoch: leases[0].Epoch}}})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	ref := claimed[0].Ref()
	out, err := s.AdvanceActive(ctx, "a", []store.ActiveTransition{
		{Ref: ref, To: task.Pausing}, {Ref: ref, To: task.Paused, Progress: json.RawMessage(`{"at":3}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Err != nil || out[0].Status != task.Pausing || out[1].Err != nil || out[1].Status != task.Paused {
		t.Errorf("outcomes %+v, want pausing then paused", out)
	}
	got, _ := s.GetTask(ctx, ref.ID)
	if got.Status != task.Paused || got.StatusVersion != 4 || !jsonEqual(got.Progress, json.RawMessage(`{"at":3}`)) {
		t.Errorf("task after both: %+v", got)
	}
	evs, err := s.TaskEvents(ctx, ref.ID)
	if err != nil || len(evs) != 4 || evs[0].To != task.Queued || evs[3].From != task.Pausing {
		t.Errorf("events %+v %v", evs, err)
	}
}

// running creates one task in bucket b and claims it for owner "a".
func running(t *testing.T, s *postgres.Store, b int, nt store.NewTask) (*task.Task, store.HeldBucket) {
	t.Helper()
	ctx := testContext(t)
	nt.Kind, nt.Bucket = "noop", b
	if _, err := s.CreateTasks(ctx, []store.NewTask{nt}); err != nil {
		t.Fatal(err)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(b), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	held := store.HeldBucket{Bucket: b, Epoch: leases[0].Epoch}
	claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "a", Node: "n", Kinds: []string{"noop"}, Limit: 1,
		LeaseTTL: time.Minute, Buckets: []store.HeldBucket{held}})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	return claimed[0], held
}

func TestAPendingStopWinsOverAPause(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := migrated(t, 8)
	c, _ := running(t, s, 1, store.NewTask{})
	advance := func(to task.Status) store.Outcome {
		t.Helper()
		out, err := s.AdvanceActive(ctx, "a", []store.ActiveTransition{{Ref: c.Ref(), To: to, Node: "n"}})
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	if o := advance(task.Pausing); o.Err != nil {
		t.Fatal(o.Err)
	}
	if _, err := s.IssueCommand(ctx, store.NewCommand{TaskID: c.ID, Kind: store.CommandStop}); err != nil {
		t.Fatal(err)
	}
	// The table has no pausing -> stopped; the stop wins all the same.
	if o := advance(task.Paused); o.Err != nil || o.Status != task.Stopped {
		t.Errorf("pausing task checkpointing with a stop pending: %+v, want stopped", o)
	}
	// A stop that is not a redirect still obeys the table.
	d, _ := running(t, s, 2, store.NewTask{})
	out, err := s.AdvanceActive(ctx, "a", []store.ActiveTransition{{Ref: d.Ref(), To: task.Cancelled}})
	var te *task.TransitionError
	if err != nil || !errors.As(out[0].Err, &te) {
		t.Errorf("running -> cancelled without a stop: %+v %v, want *task.TransitionError", out, err)
	}
}

func TestMovesThatMakeWorkAreAnnounced(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := migrated(t, 8)
	c, _ := running(t, s, 5, store.NewTask{})
	sub, err := s.Listen(ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// Not due yet: nothing to announce. Then a release: bucket 5 has work.
	if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Bucket: 4, Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	out, err := s.AdvanceActive(ctx, "a", []store.ActiveTransition{{Ref: c.Ref(), To: task.Queued, Reason: "shutdown"}})
	if err != nil || out[0].Err != nil {
		t.Fatalf("release: %+v %v", out, err)
	}
	if n := receive(t, sub, store.TopicTasks, 30*time.Second); n.Payload != "5" {
		t.Errorf("after a release: %q, want 5", n.Payload)
	}
	// A resume through Transition.
	paused, err := s.Transition(ctx, store.Transition{ID: c.ID, Version: 3, To: task.Paused})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, store.Transition{ID: c.ID, Version: paused.StatusVersion, To: task.Queued}); err != nil {
		t.Fatal(err)
	}
	if n := receive(t, sub, store.TopicTasks, 30*time.Second); n.Payload != "5" {
		t.Errorf("after a resume: %q, want 5", n.Payload)
	}
}

func TestDocumentsReadBack(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := migrated(t, 8)
	c, _ := running(t, s, 1, store.NewTask{})
	if string(c.Payload) != "null" {
		t.Errorf("a task created without a payload has %q, want JSON null", c.Payload)
	}
	if c.Result != nil || c.Progress != nil {
		t.Errorf("a new attempt has result %q and progress %q, want none", c.Result, c.Progress)
	}
	if err := s.SaveProgress(ctx, "a", c.Ref(), nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetTask(ctx, c.ID); string(got.Progress) != "null" {
		t.Errorf("progress saved as nil reads %q, want JSON null", got.Progress)
	}
	if err := s.SaveProgress(ctx, "a", task.Ref{ID: c.ID + 100, ClaimSeq: 1}, nil); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("progress of a missing task: %v, want store.ErrNotFound", err)
	}
	if _, err := s.AdvanceActive(ctx, "a", []store.ActiveTransition{{Ref: c.Ref(), To: task.Succeeded, Result: json.RawMessage(`{"a":`)}}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("a result that is not JSON: %v, want store.ErrInvalid", err)
	}
}

func TestLeasesAndHeartbeatsDoNotWaitForTheApplicationsConnections(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	const mainConns = 3
	s := migrated(t, 16, postgres.WithMaxConns(mainConns))
	const owner = "n/1"
	if err := s.RegisterNode(ctx, store.NodeInfo{ID: "n", Incarnation: owner, Buckets: bucket.All(16)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	req := store.AcquireRequest{Owner: owner, Node: "n", Buckets: bucket.All(16), TTL: time.Minute}
	if _, err := s.AcquireBuckets(ctx, req); err != nil {
		t.Fatal(err)
	}

	// The application holds every connection of the main pool, as a burst
	// of long queries on a shared store does.
	for range mainConns {
		conn, err := s.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Release)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := s.Now(waitCtx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a query with the main pool full: %v, want it to wait for a connection until its deadline", err)
	}

	// A node renews within heartbeat/2: 2.5s with the default lease TTL.
	const renewalTimeout = 2500 * time.Millisecond
	for _, step := range []struct {
		name string
		call func(context.Context) error
	}{
		{"renewal", func(ctx context.Context) error {
			leases, err := s.AcquireBuckets(ctx, req)
			for _, l := range leases {
				if !l.Held || l.Acquired {
					return fmt.Errorf("bucket %d: %+v, want it renewed", l.Bucket, l)
				}
			}
			return err
		}},
		{"heartbeat", func(ctx context.Context) error { return s.HeartbeatNode(ctx, owner, time.Minute) }},
		{"release", func(ctx context.Context) error {
			released, err := s.ReleaseBuckets(ctx, owner, bucket.Of(3))
			if err == nil && !reflect.DeepEqual(released, []int{3}) {
				return fmt.Errorf("released %v, want [3]", released)
			}
			return err
		}},
	} {
		callCtx, cancel := context.WithTimeout(ctx, renewalTimeout)
		err := step.call(callCtx)
		cancel()
		if err != nil {
			t.Errorf("%s with the main pool full: %v, want it done within %v", step.name, err, renewalTimeout)
		}
	}
}

// A stop is committed, with its command row, by a transaction that held the
// task's row while a completion waited for it. The completion must see the
// stop on the row it locks (the task ends stopped) and acknowledge the
// command in the same move, although the command row did not exist when the
// completion was sent.
func TestAStopCommittedWhileACompletionWaitsIsHonouredAndAcknowledged(t *testing.T) {
	t.Parallel()
	for _, move := range []string{"completion", "rescue"} {
		t.Run(move, func(t *testing.T) {
			ctx := testContext(t)
			s := migrated(t, 8)
			c, held := running(t, s, 1, store.NewTask{MaxAttempts: 3})
			tx, err := s.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			if _, err := tx.Exec(ctx, `SELECT 1 FROM flotilla_tasks WHERE id = $1 FOR UPDATE`, c.ID); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			var status task.Status
			go func() {
				if move == "completion" {
					out, err := s.AdvanceActive(ctx, "a", []store.ActiveTransition{{Ref: c.Ref(), To: task.Retrying, Node: "n", Error: "boom"}})
					if err == nil {
						status, err = out[0].Status, out[0].Err
					}
					done <- err
					return
				}
				moved, err := s.Transition(ctx, store.Transition{ID: c.ID, Version: c.StatusVersion, To: task.Retrying,
					Node: "n", Epoch: held.Epoch, Guard: &store.LeaseGuard{Owner: "a", Epoch: held.Epoch}})
				if err == nil {
					status = moved.Status
				}
				done <- err
			}()
			eventuallyWaiting(t, s, 1)
			// What IssueCommand writes, in the transaction that holds the row.
			if _, err := tx.Exec(ctx, `UPDATE flotilla_tasks SET stop_requested = true WHERE id = $1`, c.ID); err != nil {
				t.Fatal(err)
			}
			var cmdID int64
			if err := tx.QueryRow(ctx, `INSERT INTO flotilla_commands (task_id, kind, reason, issued_by, issued_at, owner)
				VALUES ($1, 'stop', '', 'test', statement_timestamp(), 'a') RETURNING id`, c.ID).Scan(&cmdID); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", move, err)
			}
			if status != task.Stopped {
				t.Errorf("%s with a stop committed while it waited: %s, want stopped", move, status)
			}
			cmd, err := s.GetCommand(ctx, cmdID)
			if err != nil || cmd.Outcome != store.OutcomeStopped || cmd.AckedBy != "n" {
				t.Errorf("the stop: %+v %v, want acknowledged %q by n in the same move", cmd, err, store.OutcomeStopped)
			}
		})
	}
}

// eventuallyWaiting waits until n statements of the store's database wait
// for a lock.
func eventuallyWaiting(t *testing.T, s *postgres.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(patience.Scale(30 * time.Second))
	for {
		var waiting int
		err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err == nil && waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d statements wait for a lock after 30s (%v)", n, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A node submits through the store it listens on: its subscription hears of
// the tasks as CreateTasks returns, without waiting for the server to
// deliver the notification. Another process's store hears of them through
// the server.
func TestASubscriptionHearsOfItsOwnStoresTasksWhenTheyCommit(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dsn := testdb.New(t)
	s := open(t, dsn)
	if _, err := s.Migrate(ctx, 8); err != nil {
		t.Fatal(err)
	}
	other := open(t, dsn)
	own, err := s.Listen(ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	theirs, err := other.Listen(ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()

	if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "a", Bucket: 5}}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-own.C():
		if n.Topic != store.TopicTasks || n.Payload != "5" {
			t.Errorf("own notification %+v, want %s 5", n, store.TopicTasks)
		}
	default:
		t.Fatal("CreateTasks returned before its own store's subscription heard of the task")
	}
	if n := receive(t, theirs, store.TopicTasks, 30*time.Second); n.Payload != "5" {
		t.Errorf("another store's notification %q, want 5", n.Payload)
	}
	// A task not yet due is not announced, locally or otherwise.
	if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "b", Bucket: 6, Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-own.C():
		if n.Payload != "5" { // the server's copy of the first may still come
			t.Errorf("notification %+v for a task that is not due", n)
		}
	default:
	}
}

// A step's pause or cancellation is committed by a transaction that held
// the step's row while the end of its dependency, which releases it, waited
// for that row. The release re-reads the row it waited for: a step paused
// meanwhile counts down and stays paused, with no event of the release's
// (the state it left is told by the state it is in, not read before the
// wait); a step cancelled meanwhile is not moved at all. Its sibling, which
// nobody held, is released as usual.
func TestAStepMovedWhileItsReleaseWaitsIsReleasedAsTheMoveLeftIt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ move, status string }{{"pause", "paused"}, {"cancel", "cancelled"}} {
		t.Run(c.move, func(t *testing.T) {
			ctx := testContext(t)
			s := migrated(t, 8)
			p, err := s.CreatePipeline(ctx, store.NewPipeline{Name: "fan", Key: "fan", Steps: []task.Step{
				{Name: "a", Kind: "noop"},
				{Name: "b", Kind: "noop", DependsOn: []task.Dependency{{Step: "a"}}},
				{Name: "c", Kind: "noop", DependsOn: []task.Dependency{{Step: "a"}}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			ids := map[string]int64{}
			for _, st := range p.Steps {
				ids[st.Name] = st.Task.ID
			}
			leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(p.Bucket), TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "a", Node: "n", Kinds: []string{"noop"}, Limit: 10,
				Buckets: []store.HeldBucket{{Bucket: p.Bucket, Epoch: leases[0].Epoch}}, LeaseTTL: time.Minute})
			if err != nil || len(claimed) != 1 || claimed[0].ID != ids["a"] {
				t.Fatalf("claimed %v, %v; want step a alone", claimed, err)
			}
			tx, err := s.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			// The step's move as a pause or a stop of a pending step writes
			// it, in the transaction that holds the row.
			if _, err := tx.Exec(ctx, `
				WITH m AS (
				    UPDATE flotilla_tasks SET status = $2, status_version = status_version + 1,
				        finished_at = CASE WHEN $2 = 'cancelled' THEN statement_timestamp() END
				    WHERE id = $1 RETURNING id, status_version
				)
				INSERT INTO flotilla_task_events (task_id, seq, from_status, to_status, at, node, epoch, attempt, reason, error)
				SELECT id, status_version, 'pending', $2, statement_timestamp(), '', 0, 0, $3, '' FROM m`,
				ids["b"], c.status, c.move+" requested"); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := s.AdvanceActive(ctx, "a", []store.ActiveTransition{{Ref: claimed[0].Ref(), To: task.Succeeded, Node: "n"}})
				done <- err
			}()
			eventuallyWaiting(t, s, 1)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("ending a: %v", err)
			}
			got, err := s.GetPipeline(ctx, p.ID)
			if err != nil {
				t.Fatal(err)
			}
			statuses := map[string]task.Status{}
			for _, st := range got.Steps {
				statuses[st.Name] = st.Task.Status
			}
			if statuses["b"] != task.Status(c.status) || statuses["c"] != task.Queued {
				t.Errorf("after a %s committed while a's end waited: b %s, c %s; want b %s, c queued",
					c.move, statuses["b"], statuses["c"], c.status)
			}
			evs, err := s.TaskEvents(ctx, ids["b"])
			if err != nil {
				t.Fatal(err)
			}
			if last := evs[len(evs)-1]; len(evs) != 2 || last.From != task.Pending || last.To != task.Status(c.status) {
				t.Errorf("b's trail %+v; want its creation and its %s alone", evs, c.move)
			}
		})
	}
}
