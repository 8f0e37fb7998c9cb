package flotilla_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/flotillatest"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

type resizeArgs struct {
	Image string `json:"image"`
	Width int    `json:"width"`
}

func (resizeArgs) Kind() string { return "resize" }

type thumbnail struct {
	URL   string `json:"url"`
	Bytes int    `json:"bytes"`
}

func resize(_ context.Context, job *flotilla.Job[resizeArgs]) (thumbnail, error) {
	if job.Args.Width <= 0 {
		return thumbnail{}, task.NoRetry(errors.New("width must be positive"))
	}
	return thumbnail{URL: job.Args.Image + "@" + job.Key, Bytes: job.Args.Width * 64}, nil
}

func resizeFleet(t *testing.T, opts ...flotillatest.FleetOption) *flotillatest.Fleet {
	t.Helper()
	return flotillatest.NewFleet(t, func(n *node.Node) error { return flotilla.Handle(n, resize) }, opts...)
}

func TestHandleDecodesTheArgsAndStoresTheResult(t *testing.T) {
	fleet := resizeFleet(t)
	ctx := t.Context()
	tk, err := flotilla.SubmitArgs(ctx, fleet.Client, resizeArgs{Image: "cat.png", Width: 2}, flotilla.WithKey("k1"))
	if err != nil {
		t.Fatal(err)
	}
	if tk.Kind != "resize" || string(tk.Payload) != `{"image":"cat.png","width":2}` && string(tk.Payload) != `{"image": "cat.png", "width": 2}` {
		t.Errorf("submitted %s task with payload %s", tk.Kind, tk.Payload)
	}
	got, err := flotilla.WaitResult[thumbnail](ctx, fleet.Client, tk.ID)
	if err != nil || got != (thumbnail{URL: "cat.png@k1", Bytes: 128}) {
		t.Errorf("WaitResult = %+v, %v", got, err)
	}
}

// A payload with a field the type does not have is a bad task: it fails at
// its first attempt, with an error naming the field, and is not retried.
func TestHandleRefusesAPayloadWithAFieldTheTypeLacks(t *testing.T) {
	fleet := resizeFleet(t)
	ctx := t.Context()
	for name, payload := range map[string]string{
		"unknown field":    `{"image":"dog.png","height":64}`,
		"wrong value type": `{"image":"dog.png","width":"wide"}`,
	} {
		tk, err := fleet.Client.Submit(ctx, flotilla.TaskRequest{Kind: "resize", Key: "dog", Payload: json.RawMessage(payload)})
		if err != nil {
			t.Fatal(err)
		}
		done := fleet.Wait(tk.ID)
		if done.Status != task.Failed || done.Attempt != 1 {
			t.Errorf("%s: task ended %s at attempt %d of %d, want failed at its first", name, done.Status, done.Attempt, done.MaxAttempts)
		}
		for _, want := range []string{"resize task", "does not decode into flotilla_test.resizeArgs"} {
			if !strings.Contains(done.Error, want) {
				t.Errorf("%s: error %q lacks %q", name, done.Error, want)
			}
		}
		if name == "unknown field" && !strings.Contains(done.Error, `unknown field "height"`) {
			t.Errorf("error %q does not name the field", done.Error)
		}
		_, err = flotilla.ResultOf[thumbnail](done)
		if !errors.Is(err, flotilla.ErrNoResult) || !strings.Contains(err.Error(), "failed") {
			t.Errorf("ResultOf a failed task: %v, want ErrNoResult naming its state", err)
		}
	}
}

type pointerArgs struct{}

func (*pointerArgs) Kind() string { return "pointer" }

type badKind struct{}

func (badKind) Kind() string { return "" }

func TestHandleRefusesWhatCannotBeRegistered(t *testing.T) {
	fleet := resizeFleet(t)
	noop := func(context.Context, *flotilla.Job[*pointerArgs]) (struct{}, error) { return struct{}{}, nil }
	if err := flotilla.Handle(fleet.Node, noop); !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "pointer") {
		t.Errorf("Handle of a pointer type: %v, want store.ErrInvalid saying it is a pointer", err)
	}
	empty := func(context.Context, *flotilla.Job[badKind]) (int, error) { return 0, nil }
	if err := flotilla.Handle(fleet.Node, empty); !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "badKind") {
		t.Errorf("Handle of a type with an empty kind: %v, want store.ErrInvalid naming the type", err)
	}
	if err := flotilla.Handle(fleet.Node, resize); err == nil || !strings.Contains(err.Error(), "after Start") {
		t.Errorf("Handle on a started node: %v", err)
	}
}

func TestSubmitOptionsSetTheTasksFields(t *testing.T) {
	fleet := flotillatest.NewFleet(t, nil)
	ctx := t.Context()
	runAt := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	md := map[string]string{"request": "r-1"}
	tk, err := flotilla.SubmitArgs(ctx, fleet.Client, resizeArgs{Image: "a"},
		flotilla.WithKey("album-7"), flotilla.WithPriority(9), flotilla.WithMaxAttempts(5), flotilla.WithRunAt(runAt),
		flotilla.WithUniqueKey("resize-a"), flotilla.WithTimeout(time.Minute), flotilla.WithLimitKey("tenant-3"),
		flotilla.WithResources(store.Resources{"gpu": 1}), flotilla.WithMetadata(md), flotilla.WithMetadata(map[string]string{"more": "x"}),
		flotilla.AllowUnknownKind())
	if err != nil {
		t.Fatal(err)
	}
	got, err := fleet.Client.Get(ctx, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != "album-7" || got.Priority != 9 || got.MaxAttempts != 5 || !got.RunAt.Equal(runAt) || got.Status != task.Scheduled ||
		got.UniqueKey != "resize-a" || got.Timeout != time.Minute || got.LimitKey != "tenant-3" || got.Resources["gpu"] != 1 ||
		!maps.Equal(got.Metadata, map[string]string{"request": "r-1", "more": "x"}) {
		t.Errorf("the task read back as %+v", got)
	}
	if len(md) != 1 {
		t.Errorf("WithMetadata changed the caller's map: %v", md)
	}
	delayed, err := flotilla.SubmitArgs(ctx, fleet.Client, resizeArgs{Image: "b"}, flotilla.WithRunAt(runAt),
		flotilla.WithDelay(2*time.Hour), flotilla.AllowUnknownKind())
	if err != nil || delayed.RunAt.Before(runAt.Add(30*time.Minute)) {
		t.Errorf("WithDelay after WithRunAt: %v, %v; want the delay to win", delayed, err)
	}
	if _, err := flotilla.SubmitArgs(ctx, fleet.Client, resizeArgs{Image: "a"}, flotilla.WithUniqueKey("resize-a"),
		flotilla.AllowUnknownKind()); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("a second task of unique key resize-a: %v, want store.ErrDuplicate", err)
	}

	// Options given to Submit apply over the request, to every task of SubmitMany.
	many, err := fleet.Client.SubmitMany(ctx, []flotilla.TaskRequest{{Kind: "x", Key: "a"}, {Kind: "x", Key: "b", Priority: 1}},
		flotilla.WithPriority(3), flotilla.AllowUnknownKind())
	if err != nil || many[0].Priority != 3 || many[1].Priority != 3 {
		t.Errorf("SubmitMany with WithPriority(3): %v", err)
	}
	if _, err := fleet.Client.SubmitPipeline(ctx, flotilla.PipelineRequest{Name: "p", Steps: []task.Step{{Name: "a", Kind: "x"}}},
		flotilla.WithKey("k"), flotilla.WithPriority(1)); !errors.Is(err, store.ErrInvalid) ||
		!strings.Contains(err.Error(), "WithKey, WithPriority") {
		t.Errorf("SubmitPipeline with task options: %v, want store.ErrInvalid naming them", err)
	}
}

func TestNewRequestAndTheTransactionalSubmits(t *testing.T) {
	fleet := resizeFleet(t)
	ctx := t.Context()
	db := appDB(fleet.DSN)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	one, err := flotilla.SubmitArgsSQLiteTx(ctx, fleet.Client, tx, resizeArgs{Image: "x", Width: 1}, flotilla.WithKey("tx"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := flotilla.NewRequest(resizeArgs{Image: "y", Width: 1}, flotilla.WithKey("tx"), flotilla.WithPriority(2))
	if err != nil || r.Kind != "resize" || r.Key != "tx" || r.Priority != 2 {
		t.Fatalf("NewRequest = %+v, %v", r, err)
	}
	two, err := fleet.Client.SubmitSQLiteTx(ctx, tx, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{one.ID, two[0].ID} {
		if got, err := flotilla.ResultOf[thumbnail](fleet.Wait(id)); err != nil || got.Bytes != 64 {
			t.Errorf("task %d: %+v, %v", id, got, err)
		}
	}
}

func TestConnectRefusesADatabaseWithoutTheSchemaAndCreatesNothing(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	path := filepath.Join(dir, "app.db")
	_, err := flotilla.Connect(ctx, "sqlite:"+path)
	if !errors.Is(err, flotilla.ErrNoSchema) || !errors.Is(err, store.ErrSchema) || !strings.Contains(err.Error(), "flotilla.Migrate") ||
		strings.Contains(err.Error(), "worker") || !strings.Contains(err.Error(), path) {
		t.Errorf("Connect on a missing SQLite file: %v; want ErrNoSchema naming the file and flotilla.Migrate, no command", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("Connect on a missing SQLite file left %d files behind, first %s", len(entries), entries[0].Name())
	}

	// An SQLite file that exists but is not a fleet's.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := flotilla.Connect(ctx, "sqlite:"+path); !errors.Is(err, flotilla.ErrNoSchema) {
		t.Errorf("Connect on an empty SQLite file: %v, want ErrNoSchema", err)
	}

	pg := testdb.New(t)
	if _, err := flotilla.Connect(ctx, pg); !errors.Is(err, flotilla.ErrNoSchema) || !strings.Contains(err.Error(), "flotilla.Migrate") {
		t.Errorf("Connect on an empty PostgreSQL database: %v, want ErrNoSchema", err)
	}

	for _, dsn := range []string{"sqlite:" + path, pg} {
		if err := flotilla.Migrate(ctx, dsn, flotilla.WithNumBuckets(8)); err != nil {
			t.Fatal(err)
		}
		if err := flotilla.Migrate(ctx, dsn); err != nil {
			t.Errorf("Migrate again: %v", err)
		}
		c, err := flotilla.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("Connect after Migrate: %v", err)
		}
		if n := c.Policy().Count(); n != 8 {
			t.Errorf("the fleet has %d buckets, want the 8 of WithNumBuckets", n)
		}
		c.Close()
		var bc *store.BucketCountError
		if err := flotilla.Migrate(ctx, dsn, flotilla.WithNumBuckets(16)); !errors.As(err, &bc) {
			t.Errorf("Migrate with another bucket count: %v, want *store.BucketCountError", err)
		}
	}
	missing := testdb.Missing(t)
	if err := flotilla.Migrate(ctx, missing); err != nil {
		t.Fatalf("Migrate of a database that does not exist: %v", err)
	}
	c, err := flotilla.Connect(ctx, missing)
	if err != nil {
		t.Fatalf("Connect to the database Migrate created: %v", err)
	}
	c.Close()
}

func TestCommandsTakeReasonAndBy(t *testing.T) {
	fleet := flotillatest.NewFleet(t, nil)
	ctx := t.Context()
	tk, err := flotilla.SubmitArgs(ctx, fleet.Client, resizeArgs{}, flotilla.WithKey("k"), flotilla.AllowUnknownKind())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.Client.Pause(ctx, tk.ID, flotilla.Reason("maintenance"), flotilla.By("ops")); err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.Client.Resume(ctx, tk.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.Client.Stop(ctx, tk.ID, flotilla.By("ops"), flotilla.Reason("not needed")); err != nil {
		t.Fatal(err)
	}
	r, err := fleet.Client.Report(ctx, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, e := range r.Events {
		reasons = append(reasons, e.Reason)
	}
	got := strings.Join(reasons, " | ")
	for _, want := range []string{"pause requested by ops: maintenance", "resume requested", "stop requested by ops: not needed"} {
		if !strings.Contains(got, want) {
			t.Errorf("the trail %q lacks %q", got, want)
		}
	}
	// Get and List answer the same type, and the same task.
	one, err := fleet.Client.Get(ctx, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	list, err := fleet.Client.List(ctx, store.TaskFilter{})
	if err != nil || len(list) != 1 || list[0].ID != one.ID || list[0].Status != one.Status || one.Status != task.Cancelled {
		t.Errorf("Get %+v and List %+v (%v) disagree, or the task is not cancelled", one, list, err)
	}
}

func TestWaitEndsWithTheContext(t *testing.T) {
	fleet := flotillatest.NewFleet(t, nil)
	tk, err := flotilla.SubmitArgs(t.Context(), fleet.Client, resizeArgs{}, flotilla.AllowUnknownKind())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	got, err := fleet.Client.Wait(ctx, tk.ID)
	// The task as last read, unless the deadline came before any read
	// ended, on a machine loaded enough.
	if !errors.Is(err, context.DeadlineExceeded) || got != nil && got.Status != task.Queued {
		t.Errorf("Wait on a task nobody runs: %+v, %v; want the deadline, and the task as queued", got, err)
	}
	if _, err := fleet.Client.Wait(t.Context(), 1<<40); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Wait on a missing task: %v, want store.ErrNotFound", err)
	}
}

func TestSubmitMiddlewareSeesEverySubmit(t *testing.T) {
	var mu = make(chan struct{}, 1)
	var seen []string
	mw := func(next flotilla.SubmitFunc) flotilla.SubmitFunc {
		return func(ctx context.Context, rs []flotilla.TaskRequest) ([]*task.Task, error) {
			mu <- struct{}{}
			for i := range rs {
				seen = append(seen, rs[i].Kind+"/"+rs[i].Key)
				rs[i].Metadata = map[string]string{"seen": "yes"}
			}
			<-mu
			return next(ctx, rs)
		}
	}
	fleet := resizeFleet(t, flotillatest.WithClientOptions(flotilla.WithSubmitMiddleware(mw)))
	ctx := t.Context()
	a, err := flotilla.SubmitArgs(ctx, fleet.Client, resizeArgs{Width: 1}, flotilla.WithKey("a"))
	if err != nil {
		t.Fatal(err)
	}
	db := appDB(fleet.DSN)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fleet.Client.SubmitSQLiteTx(ctx, tx, flotilla.TaskRequest{Kind: "resize", Key: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(seen, " "); got != "resize/a resize/b" {
		t.Errorf("the middleware saw %q", got)
	}
	for _, tk := range []*task.Task{a, b[0]} {
		if got, err := fleet.Client.Get(ctx, tk.ID); err != nil || got.Metadata["seen"] != "yes" {
			t.Errorf("task %d: metadata %v (%v), want what the middleware set", tk.ID, got.Metadata, err)
		}
	}
}
