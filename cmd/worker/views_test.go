package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// viewFleet is a migrated fleet where node "live" holds buckets 0-9 of the
// 0-31 it declares, node "recent" stopped just now, and node "old" stopped
// two days ago.
func viewFleet(t *testing.T) string {
	t.Helper()
	withoutDSNEnv(t)
	dsn := testdb.New(t)
	if _, stderr, code := runWorker(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatal(stderr)
	}
	ctx := context.Background()
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, n := range []store.NodeInfo{
		{ID: "live", Incarnation: "live/1", Buckets: bucket.All(32), Kinds: []string{"noop"}},
		{ID: "recent", Incarnation: "recent/1", Buckets: bucket.Of(40), Kinds: []string{"noop"}},
		{ID: "old", Incarnation: "old/1", Buckets: bucket.Of(41), Kinds: []string{"noop"}},
	} {
		if err := s.RegisterNode(ctx, n, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for _, inc := range []string{"recent/1", "old/1"} {
		if err := s.StopNode(ctx, inc); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "live/1", Node: "live",
		Buckets: bucket.All(10), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, `UPDATE flotilla_nodes SET stopped_at = now() - interval '2 days' WHERE id = 'old'`); err != nil {
		t.Fatal(err)
	}
	return dsn
}

func TestNodesShowDeclaredAndHeldBucketsAndHideOldStoppedNodes(t *testing.T) {
	dsn := viewFleet(t)
	stdout, stderr, code := runWorker(t, "nodes", "--dsn", dsn)
	if code != exitOK {
		t.Fatal(stderr)
	}
	if !strings.Contains(stdout, "DECLARED") || !strings.Contains(stdout, "HELD") {
		t.Errorf("nodes table lacks DECLARED and HELD:\n%s", stdout)
	}
	var liveLine string
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(line, "live ") {
			liveLine = line
		}
	}
	if !strings.Contains(liveLine, "0-31") || !strings.Contains(liveLine, "0-9") {
		t.Errorf("node live's row %q does not show declared 0-31 and held 0-9", liveLine)
	}
	if !strings.Contains(stdout, "recent") || strings.Contains(stdout, "old ") ||
		!strings.Contains(stdout, "1 nodes stopped more than a day ago not shown") {
		t.Errorf("nodes without --all shows old or hides recent:\n%s", stdout)
	}
	stdout, _, _ = runWorker(t, "nodes", "--dsn", dsn, "--all", "--json")
	var ns []nodeJSON
	if err := json.Unmarshal([]byte(stdout), &ns); err != nil {
		t.Fatal(err)
	}
	ids := map[string]nodeJSON{}
	for _, n := range ns {
		ids[n.ID] = n
	}
	if len(ns) != 3 || ids["live"].Held != "0-9" || ids["live"].Buckets != "0-31" {
		t.Errorf("nodes --all --json: %+v", ns)
	}
}

func TestBucketsFiltersAndSummary(t *testing.T) {
	dsn := viewFleet(t)
	stdout, _, code := runWorker(t, "buckets", "--dsn", dsn)
	if code != exitOK || !strings.Contains(stdout, "64 buckets: 10 held by 1 nodes, 54 unheld (10-63)") {
		t.Errorf("buckets summary:\n%s", stdout)
	}
	stdout, _, _ = runWorker(t, "buckets", "--dsn", dsn, "--held-by", "live", "--json")
	var bs []bucketJSON
	if err := json.Unmarshal([]byte(stdout), &bs); err != nil {
		t.Fatal(err)
	}
	if len(bs) != 10 || bs[0].Bucket != 0 || bs[9].Bucket != 9 {
		t.Errorf("--held-by live: %d buckets: %+v", len(bs), bs)
	}
	stdout, _, _ = runWorker(t, "buckets", "--dsn", dsn, "--unheld", "--json")
	bs = nil
	if err := json.Unmarshal([]byte(stdout), &bs); err != nil {
		t.Fatal(err)
	}
	if len(bs) != 54 || bs[0].Bucket != 10 {
		t.Errorf("--unheld: %d buckets", len(bs))
	}
}

// TestGetSaysWhyATaskWaits: get shows the run
// and retry times and why a task waits; list filters by node and shows the
// finished time and the error's first line.
func TestGetSaysWhyATaskWaits(t *testing.T) {
	dsn := viewFleet(t)
	stdout, stderr, code := runWorker(t, "submit", "--dsn", dsn, "--kind", "noop", "--key", "k", "--delay", "1h", "--allow-unowned")
	if code != exitOK {
		t.Fatal(stderr)
	}
	id := strings.TrimSpace(stdout)
	stdout, _, _ = runWorker(t, "get", "--dsn", dsn, id)
	for _, want := range []string{"delayed until", "no live node holds bucket", "run at", "started", "finished"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("get does not say %q:\n%s", want, stdout)
		}
	}
	stdout, _, _ = runWorker(t, "list", "--dsn", dsn)
	if !strings.Contains(stdout, "FINISHED") || !strings.Contains(stdout, "ERROR") {
		t.Errorf("list lacks FINISHED and ERROR:\n%s", stdout)
	}
	stdout, _, _ = runWorker(t, "list", "--dsn", dsn, "--node", "live", "--json")
	if strings.TrimSpace(stdout) != "[]" {
		t.Errorf("list --node live: %s, want none (no task ran there)", stdout)
	}
}
