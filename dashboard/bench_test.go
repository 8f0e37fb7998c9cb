package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// Sizes of the page benchmark's table (issue: every page under 200 ms with
// 1,000,000 finished and 100,000 queued tasks).
const (
	benchFinished = 1_000_000
	benchQueued   = 100_000
)

// BenchmarkPages renders every page of the dashboard against PostgreSQL
// with benchFinished finished and benchQueued queued tasks, through the
// handler as `worker ui` serves it. Run it by hand (a minute of setup):
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 20x ./dashboard/
//
// The figures are in docs/benchmarks.md.
func BenchmarkPages(b *testing.B) {
	ctx := context.Background()
	dsn := testdb.New(b)
	// The table is filled without a statement timeout; the pages are
	// served with `worker ui`'s.
	setup, err := postgres.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer setup.Close()
	if _, err := setup.Migrate(ctx, bucket.DefaultCount); err != nil {
		b.Fatal(err)
	}
	s, err := postgres.New(ctx, dsn, postgres.WithStatementTimeout(DefaultQueryTimeout))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	// Finished tasks first, then the queue, as a live fleet's table looks:
	// the newest ids are the unfinished ones. One customer in 1,000 per
	// payload value; one finished task in 50 failed.
	for _, q := range []string{
		fmt.Sprintf(`INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, attempt, max_attempts, payload,
			error, node, epoch, claim_seq, created_at, started_at, finished_at, updated_at)
		SELECT CASE WHEN g %% 3 = 0 THEN 'report' ELSE 'email' END, 'key-' || g, g %% %[2]d,
			CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'succeeded' END,
			now() - interval '1 day', 1, 3, jsonb_build_object('customer', g %% 1000, 'n', g),
			CASE WHEN g %% 50 = 0 THEN 'boom' ELSE '' END, 'node-' || (g %% 2), 1, 1,
			now() - interval '1 day', now() - interval '1 day', now() - interval '23 hours', now() - interval '23 hours'
		FROM generate_series(1, %[1]d) g`, benchFinished, bucket.DefaultCount),
		fmt.Sprintf(`INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, payload, created_at, updated_at)
		SELECT 'email', 'queued-' || g, g %% %[2]d, 'queued', now() - interval '1 minute', 3,
			jsonb_build_object('customer', g %% 1000), now() - interval '1 minute', now() - interval '1 minute'
		FROM generate_series(1, %[1]d) g`, benchQueued, bucket.DefaultCount),
		`ANALYZE flotilla_tasks`,
	} {
		if _, err := setup.Pool().Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	for i, set := range []bucket.Set{bucket.Of(rangeOf(0, 31)...), bucket.Of(rangeOf(32, 63)...)} {
		n := store.NodeInfo{ID: fmt.Sprintf("node-%d", i), Incarnation: fmt.Sprintf("node-%d/x", i), Buckets: set,
			Kinds: []string{"email", "report"}}
		if err := s.RegisterNode(ctx, n, time.Hour); err != nil {
			b.Fatal(err)
		}
		if _, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: n.Incarnation, Node: n.ID, Buckets: set, TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	// Every request reads the store: no view is shared between requests,
	// as when the first viewer of each LiveInterval asks. The counts and
	// charts are shared for countsEvery, except by "fleet-counts".
	d, err := New(ctx, Config{Store: s, LiveInterval: time.Nanosecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Close)
	mid := benchFinished / 2
	pages := []struct{ name, path string }{
		{"fleet", "/fleet"},
		{"fleet-counts", "/fleet"}, // the counts by kind and the charts read afresh too
		{"tasks", "/tasks"},
		{"tasks-queued", "/tasks?state=queued"},
		{"tasks-failed", "/tasks?state=failed"},
		{"tasks-kind", "/tasks?kind=report"},
		{"tasks-key", "/tasks?key=key-777777"},
		{"tasks-bucket", "/tasks?bucket=5"},
		{"tasks-node", "/tasks?node=node-1"},
		{"tasks-page-deep", fmt.Sprintf("/tasks?before=%d", mid)},
		{"tasks-payload", "/tasks?payload=" + url.QueryEscape(`{"customer": 7}`)},
		{"task", fmt.Sprintf("/tasks/%d", mid)},
		{"schedules", "/schedules"},
		{"pipelines", "/pipelines"},
		{"bulk-review-failed", "/tasks/bulk?state=failed&action=retry"},
	}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				if p.name == "fleet-counts" {
					// As the first viewer of each countsEvery pays.
					d.cache.mu.Lock()
					d.cache.countsAt, d.cache.dayAt = time.Time{}, time.Time{}
					d.cache.mu.Unlock()
				}
				w := httptest.NewRecorder()
				d.ServeHTTP(w, httptest.NewRequest(http.MethodGet, p.path, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("GET %s: %d\n%s", p.path, w.Code, w.Body.String())
				}
			}
		})
	}
}

func rangeOf(from, to int) []int {
	out := make([]int, 0, to-from+1)
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}
