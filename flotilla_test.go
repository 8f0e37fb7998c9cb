package flotilla_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }

type testBundle struct {
	ctx    context.Context
	dsn    string
	store  *postgres.Store
	client *flotilla.Client
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	dsn := testdb.New(t)
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx, 0); err != nil {
		t.Fatal(err)
	}
	c, err := flotilla.NewClient(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{ctx: ctx, dsn: dsn, store: s, client: c}
}

// startNode runs a node holding buckets 0-31 that runs kind "work".
func (b *testBundle) startNode(t *testing.T) *node.Node {
	t.Helper()
	n, err := node.New(b.store, node.Config{NodeID: "low", Buckets: span(0, 31), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	n.Register("work", func(context.Context, *task.Task) error { return nil })
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return n
}

func span(from, to int) bucket.Set {
	var bs []int
	for i := from; i <= to; i++ {
		bs = append(bs, i)
	}
	return bucket.Of(bs...)
}

// keyIn finds a key that hashes into the given set.
func keyIn(t *testing.T, p bucket.Policy, set bucket.Set) string {
	for i := 0; i < 10000; i++ {
		if k := fmt.Sprintf("tenant-%d", i); set.Contains(p.Of(k)) {
			return k
		}
	}
	t.Fatalf("no key found in %s", set)
	return ""
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience.Scale(30 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSubmitRoutesByKeyAndRuns(t *testing.T) {
	b := setup(t)
	b.startNode(t)
	key := keyIn(t, b.client.Policy(), span(0, 31))
	created, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if created.Bucket != b.client.Policy().Of(key) {
		t.Errorf("bucket %d, want %d", created.Bucket, b.client.Policy().Of(key))
	}
	eventually(t, "the task succeeds", func() bool {
		r, err := b.client.Report(b.ctx, created.ID)
		return err == nil && r.Task.Status == task.Succeeded
	})
	r, _ := b.client.Report(b.ctx, created.ID)
	if r.Task.Node != "low" || len(r.Events) != 3 || r.Waiting != "" {
		t.Errorf("report: node %q, %d events, waiting %q", r.Task.Node, len(r.Events), r.Waiting)
	}
}

func TestSubmitAcceptsABucketWhoseLeaseLapsedWhileALiveNodeDeclaresIt(t *testing.T) {
	// A live node declares buckets 0-31 but holds none of them at this
	// moment: its renewal ran late on a loaded machine and the leases
	// lapsed. It takes them at its next pass, so a task there is served.
	b := setup(t)
	err := b.store.RegisterNode(b.ctx, store.NodeInfo{
		ID: "late", Incarnation: "late/1", Buckets: span(0, 31), Kinds: []string{"work"},
	}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p := b.client.Policy()
	if _, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work", Key: keyIn(t, p, span(0, 31))}); err != nil {
		t.Errorf("submit to a bucket a live node declares: %v, want it accepted", err)
	}
	_, err = b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "resize", Key: keyIn(t, p, span(0, 31))})
	var unserved *flotilla.UnservedKindError
	if !errors.As(err, &unserved) || unserved.Holder != "late" {
		t.Errorf("submit of a kind the declaring node does not run: %v, want *UnservedKindError naming it", err)
	}
	_, err = b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work", Key: keyIn(t, p, span(32, 63))})
	var unheld *flotilla.UnheldBucketError
	if !errors.As(err, &unheld) {
		t.Errorf("submit to a bucket no live node holds or declares: %v, want *UnheldBucketError", err)
	}
}

func TestSubmitRefusesWhatNobodyWouldServe(t *testing.T) {
	b := setup(t)
	b.startNode(t)
	p := b.client.Policy()
	foreign := keyIn(t, p, span(32, 63))

	_, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work", Key: foreign})
	var unheld *flotilla.UnheldBucketError
	if !errors.As(err, &unheld) || !errors.Is(err, flotilla.ErrRefused) || unheld.Bucket != p.Of(foreign) {
		t.Fatalf("submit to an unheld bucket: %v, want *UnheldBucketError", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprint(p.Of(foreign))) {
		t.Errorf("%q does not name the bucket", err)
	}

	_, err = b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "resize", Key: keyIn(t, p, span(0, 31))})
	var unserved *flotilla.UnservedKindError
	if !errors.As(err, &unserved) || unserved.Holder != "low" || unserved.Kind != "resize" {
		t.Fatalf("submit of a kind the holder does not run: %v, want *UnservedKindError", err)
	}
	if list, _ := b.client.List(b.ctx, store.TaskFilter{}); len(list) != 0 {
		t.Fatalf("refused submissions wrote %d tasks", len(list))
	}

	// Told to, the client accepts them, and Get says why they wait.
	waiting, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work", Key: foreign}, flotilla.AllowUnowned())
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.client.Report(b.ctx, waiting.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.Waiting, "no live node holds bucket") {
		t.Errorf("waiting reason %q", r.Waiting)
	}
	resize, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "resize", Key: keyIn(t, p, span(0, 31))}, flotilla.AllowUnknownKind())
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := b.client.Report(b.ctx, resize.ID); !strings.Contains(r.Waiting, `does not run kind "resize"`) {
		t.Errorf("waiting reason %q", r.Waiting)
	}
}

func TestKeylessSubmitsGoToBucketsALiveNodeHolds(t *testing.T) {
	b := setup(t)
	b.startNode(t) // holds 0-31 of the 64 buckets, runs "work"
	held := span(0, 31)
	inHeld := func(tasks ...*task.Task) {
		t.Helper()
		for _, tk := range tasks {
			if !held.Contains(tk.Bucket) || tk.Key != "" {
				t.Errorf("keyless task %d went to bucket %d with key %q, want a bucket of %s and no key",
					tk.ID, tk.Bucket, tk.Key, held)
			}
		}
	}
	for range 40 {
		created, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work"})
		if err != nil {
			t.Fatalf("keyless Submit: %v, want it accepted", err)
		}
		inHeld(created)
	}
	many := make([]flotilla.TaskRequest, 40)
	for i := range many {
		many[i] = flotilla.TaskRequest{Kind: "work"}
	}
	created, err := b.client.SubmitMany(b.ctx, many)
	if err != nil {
		t.Fatalf("keyless SubmitMany: %v, want it accepted", err)
	}
	inHeld(created...)
	tx, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	created, err = b.client.SubmitTx(b.ctx, tx, many...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	inHeld(created...)

	// A kind the holder does not run has no bucket to wait in, unless the
	// submitter accepts that it waits.
	_, err = b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "resize"})
	var unserved *flotilla.UnservedKindError
	if !errors.As(err, &unserved) || !errors.Is(err, flotilla.ErrRefused) || unserved.Kind != "resize" ||
		!strings.Contains(err.Error(), `runs kind "resize"`) {
		t.Fatalf("keyless submit of a kind nobody runs: %v, want *UnservedKindError", err)
	}
	resize, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "resize"}, flotilla.AllowUnknownKind())
	if err != nil {
		t.Fatal(err)
	}
	inHeld(resize)
}

func TestKeylessSubmitsAreRefusedOnlyWhenNoBucketIsHeld(t *testing.T) {
	b := setup(t) // no node
	_, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work"})
	var unheld *flotilla.UnheldBucketError
	if !errors.As(err, &unheld) || !errors.Is(err, flotilla.ErrRefused) || unheld.Bucket != -1 ||
		!strings.Contains(err.Error(), "flotilla.AllowUnowned()") || strings.Contains(err.Error(), "--") {
		t.Fatalf("keyless submit with no live node: %v, want *UnheldBucketError naming flotilla.AllowUnowned() and no flag", err)
	}
	_, err = b.client.SubmitMany(b.ctx, []flotilla.TaskRequest{{Kind: "work", Key: "k"}, {Kind: "work"}}, flotilla.AllowUnknownKind())
	if !errors.As(err, &unheld) || !strings.Contains(err.Error(), "task 1 of 2") {
		t.Fatalf("a batch with a keyless task and no live node: %v, want *UnheldBucketError naming task 1", err)
	}
	if list, _ := b.client.List(b.ctx, store.TaskFilter{}); len(list) != 0 {
		t.Fatalf("refused submissions wrote %d tasks", len(list))
	}
	waiting, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work"}, flotilla.AllowUnowned())
	if err != nil {
		t.Fatalf("keyless submit with AllowUnowned: %v", err)
	}
	if waiting.Bucket < 0 || waiting.Bucket >= b.client.Policy().Count() {
		t.Errorf("bucket %d is not one of the fleet's", waiting.Bucket)
	}
}

func TestSubmitRefusesBadInput(t *testing.T) {
	b := setup(t)
	for name, req := range map[string]flotilla.TaskRequest{
		"no kind":      {Key: "k"},
		"invalid json": {Kind: "work", Key: "k", Payload: []byte(`{"a":`)},
	} {
		if _, err := b.client.Submit(b.ctx, req, flotilla.AllowUnowned(), flotilla.AllowUnknownKind()); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want store.ErrInvalid", name, err)
		}
	}
}

func TestSubmitRefusesATimeoutTheStoreCannotKeep(t *testing.T) {
	// PostgreSQL keeps timeouts in milliseconds with 0 for none: 500µs
	// would silently become no timeout at all.
	b := setup(t)
	for _, d := range []time.Duration{500 * time.Microsecond, 2500 * time.Microsecond} {
		req := flotilla.TaskRequest{Kind: "work", Key: "k", Timeout: d}
		_, err := b.client.Submit(b.ctx, req, flotilla.AllowUnowned(), flotilla.AllowUnknownKind())
		if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), d.String()) ||
			!strings.Contains(err.Error(), "whole number of milliseconds") {
			t.Errorf("Submit with timeout %v: %v, want store.ErrInvalid naming %v and what is valid", d, err, d)
		}
		tx, err := b.store.Pool().Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.client.SubmitTx(b.ctx, tx, req); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("SubmitTx with timeout %v: %v, want store.ErrInvalid", d, err)
		}
		_ = tx.Rollback(b.ctx)
	}
	if list, _ := b.client.List(b.ctx, store.TaskFilter{}); len(list) != 0 {
		t.Fatalf("refused submissions wrote %d tasks", len(list))
	}
	ok, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work", Key: "k", Timeout: time.Millisecond},
		flotilla.AllowUnowned(), flotilla.AllowUnknownKind())
	if err != nil || ok.Timeout != time.Millisecond {
		t.Fatalf("Submit with timeout 1ms: %+v, %v; want it kept", ok, err)
	}
}

func TestSubmitTxFollowsTheCallersTransaction(t *testing.T) {
	b := setup(t)
	tx, err := b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.SubmitTx(b.ctx, tx, flotilla.TaskRequest{Kind: "work", Key: "rolled-back"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	tx, err = b.store.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.SubmitTx(b.ctx, tx, flotilla.TaskRequest{Kind: "work", Key: "committed"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	list, err := b.client.List(b.ctx, store.TaskFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Key != "committed" {
		t.Errorf("after a rollback and a commit: %+v", list)
	}
}

func TestSubmitTxRefusesAnotherStoresTransaction(t *testing.T) {
	b := setup(t)
	_, _, _, db := sqliteClient(t)
	tx, err := db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := b.client.SubmitSQLiteTx(b.ctx, tx, flotilla.TaskRequest{Kind: "work", Key: "k"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("SubmitSQLiteTx on PostgreSQL: %v, want store.ErrInvalid", err)
	}
}

func TestBucketsShowHoldersStandbysAndBacklog(t *testing.T) {
	b := setup(t)
	b.startNode(t)
	standby, err := node.New(b.store, node.Config{NodeID: "standby", Buckets: span(0, 7), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	standby.Register("work", func(context.Context, *task.Task) error { return nil })
	if err := standby.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Shutdown(context.Background()) })
	foreign := keyIn(t, b.client.Policy(), span(32, 63))
	if _, err := b.client.Submit(b.ctx, flotilla.TaskRequest{Kind: "work", Key: foreign}, flotilla.AllowUnowned()); err != nil {
		t.Fatal(err)
	}
	reports, err := b.client.Buckets(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) != 64 {
		t.Fatalf("%d buckets", len(reports))
	}
	if r := reports[3]; r.Holder != "low" || len(r.Standby) != 1 || r.Standby[0] != "standby" || r.Epoch != 1 {
		t.Errorf("bucket 3: %+v, want held by low with standby waiting", r)
	}
	if r := reports[20]; r.Holder != "low" || len(r.Standby) != 0 {
		t.Errorf("bucket 20: %+v", r)
	}
	fb := b.client.Policy().Of(foreign)
	if r := reports[fb]; r.Holder != "" || r.Queued != 1 {
		t.Errorf("bucket %d: %+v, want unheld with one queued task", fb, r)
	}
}

// TestClientRefusesWhatTheCommandLineRefuses: a Go caller gets the typed
// errors of store.CheckNewTasks and store.CheckScheduleInput, before
// anything is written, whatever the fleet's state.
func TestClientRefusesWhatTheCommandLineRefuses(t *testing.T) {
	b := setup(t)
	for name, r := range map[string]flotilla.TaskRequest{
		"key not UTF-8":  {Kind: "work", Key: "a\xff"},
		"payload NUL":    {Kind: "work", Key: "k", Payload: json.RawMessage(`{"a":"\u0000"}`)},
		"negative delay": {Kind: "work", Key: "k", Delay: -time.Second},
		"delay and at":   {Kind: "work", Key: "k", Delay: time.Second, RunAt: time.Now().Add(time.Hour)},
	} {
		_, err := b.client.Submit(b.ctx, r, flotilla.AllowUnowned(), flotilla.AllowUnknownKind())
		var ie *store.InvalidError
		if !errors.As(err, &ie) || !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: Submit = %v, want a *store.InvalidError", name, err)
		}
	}
	_, err := b.client.AddSchedule(b.ctx, schedule.Definition{Name: strings.Repeat("n", 4000), Every: time.Minute, Kind: "work"}, store.UpsertCreate)
	if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "4000 bytes") {
		t.Errorf("AddSchedule with a 4000-byte name: %v, want store.ErrInvalid naming its length", err)
	}
	tasks, err := b.client.List(b.ctx, store.TaskFilter{})
	if err != nil || len(tasks) != 0 {
		t.Errorf("refused requests left %d tasks (%v)", len(tasks), err)
	}
}
