package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
)

// bigFleet serves a read-only dashboard of a memory store of n buckets,
// three quarters of them held by three nodes, a quarter each, and no view
// shared between requests.
func bigFleet(tb testing.TB, n int) *testBundle {
	tb.Helper()
	ctx := context.Background()
	s := memory.New()
	tb.Cleanup(s.Close)
	if _, err := s.Migrate(ctx, n); err != nil {
		tb.Fatal(err)
	}
	quarter := n / 4
	for i := range 3 {
		set, err := bucket.ParseSet(fmt.Sprintf("%d-%d", i*quarter, (i+1)*quarter-1), n)
		if err != nil {
			tb.Fatal(err)
		}
		ni := store.NodeInfo{ID: fmt.Sprintf("node-%d", i), Incarnation: fmt.Sprintf("node-%d/x", i), Buckets: set,
			Kinds: []string{"email"}}
		if err := s.RegisterNode(ctx, ni, time.Hour); err != nil {
			tb.Fatal(err)
		}
		if _, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: ni.Incarnation, Node: ni.ID, Buckets: set, TTL: time.Hour}); err != nil {
			tb.Fatal(err)
		}
	}
	// A minute for a page: under the race detector the memory store's
	// 65,536 leases take seconds to list.
	d, err := New(ctx, Config{Store: s, LiveInterval: time.Nanosecond, QueryTimeout: time.Minute})
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(d)
	tb.Cleanup(func() { d.Close(); srv.Close() })
	jar, _ := cookiejar.New(nil)
	t, _ := tb.(*testing.T)
	return &testBundle{t: t, ctx: ctx, store: s, srv: srv, dash: d,
		http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// BenchmarkFleetPage65536 renders the fleet page of a 65,536-bucket fleet
// through the handler, reading the store each time (no shared view):
//
//	go test -run '^$' -bench BenchmarkFleetPage -benchtime 50x -count 5 ./dashboard/
//
// The figures are in docs/benchmarks.md; the page must stay under 300 ms.
func BenchmarkFleetPage65536(b *testing.B) {
	for _, n := range []int{1024, 65536} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			f := bigFleet(b, n)
			var size int
			for b.Loop() {
				w := httptest.NewRecorder()
				f.dash.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/fleet", nil))
				if w.Code != http.StatusOK {
					b.Fatalf("GET /fleet: %d", w.Code)
				}
				size = w.Body.Len()
			}
			b.ReportMetric(float64(size), "page-bytes")
		})
	}
}
