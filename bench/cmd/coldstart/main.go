// Command coldstart measures a node started into a backlog on PostgreSQL:
// the time from opening the store (as `worker run` does first) to the node's
// first started task, to its 100th and 1,000th, the longest wait between two
// of its first 1,000 starts, and what the node holds once started: its
// connections to the database and the process's resident memory.
//
//	cd bench && go run ./cmd/coldstart -runs 3
//
// Each run creates a database, queues the backlog through a store that is
// then closed (so that the node's backends start cold, as a new process's
// do), and drops the database at the end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

const kind = "bench-coldstart"

type result struct {
	startup, first, hundredth, thousandth, longestGap time.Duration
	// idleStartup, idleConns and idleRSSKB are of a node started on an
	// empty fleet: how long Start took, the connections it holds once
	// started, and the process's resident memory then.
	idleStartup time.Duration
	idleConns   int
	idleRSSKB   int
}

func main() {
	dsn := flag.String("dsn", os.Getenv("FLOTILLA_TEST_DSN"), "PostgreSQL server to create the benchmark databases on (default $FLOTILLA_TEST_DSN)")
	runs := flag.Int("runs", 3, "runs")
	backlog := flag.Int("backlog", 10_000, "tasks queued before the node starts")
	flag.Parse()
	if *dsn == "" || *backlog < 1000 {
		fmt.Fprintln(os.Stderr, "coldstart: give -dsn (or $FLOTILLA_TEST_DSN) and a -backlog of at least 1000")
		os.Exit(2)
	}
	ctx := context.Background()
	var all []result
	for i := range *runs {
		r, err := run(ctx, *dsn, *backlog)
		if err != nil {
			fmt.Fprintln(os.Stderr, "coldstart:", err)
			os.Exit(1)
		}
		fmt.Printf("run %d: into the backlog: start-up %s, first start %s, 100th %s, 1,000th %s, longest gap in the first 1,000 %s; idle: start-up %s, connections %d, RSS %d KiB\n",
			i+1, ms(r.startup), ms(r.first), ms(r.hundredth), ms(r.thousandth), ms(r.longestGap), ms(r.idleStartup), r.idleConns, r.idleRSSKB)
		all = append(all, r)
	}
	med := func(f func(result) float64) string {
		v := make([]float64, len(all))
		for i, r := range all {
			v[i] = f(r)
		}
		slices.Sort(v)
		return strconv.FormatFloat(v[len(v)/2], 'f', 1, 64)
	}
	d := func(f func(result) time.Duration) func(result) float64 {
		return func(r result) float64 { return float64(f(r)) / float64(time.Millisecond) }
	}
	fmt.Printf("medians: into the backlog: start-up %s ms, first start %s ms, 100th %s ms, 1,000th %s ms, longest gap %s ms; idle: start-up %s ms, connections %s, RSS %s KiB\n",
		med(d(func(r result) time.Duration { return r.startup })), med(d(func(r result) time.Duration { return r.first })),
		med(d(func(r result) time.Duration { return r.hundredth })), med(d(func(r result) time.Duration { return r.thousandth })),
		med(d(func(r result) time.Duration { return r.longestGap })), med(d(func(r result) time.Duration { return r.idleStartup })),
		med(func(r result) float64 { return float64(r.idleConns) }), med(func(r result) float64 { return float64(r.idleRSSKB) }))
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
}

func run(ctx context.Context, admin string, backlog int) (result, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "flotilla_bench_" + hex.EncodeToString(b[:])
	if err := adminExec(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0"); err != nil {
		return result{}, err
	}
	defer func() {
		_ = adminExec(context.WithoutCancel(ctx), admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}()
	dsn := withDatabase(admin, name)
	if err := queue(ctx, dsn, 0); err != nil {
		return result{}, err
	}
	var r result
	if err := idle(ctx, admin, name, &r); err != nil {
		return result{}, err
	}
	if err := queue(ctx, dsn, backlog); err != nil {
		return result{}, err
	}

	var (
		mu     sync.Mutex
		starts []time.Duration
		done   = make(chan struct{})
	)
	t0 := time.Now()
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		return result{}, err
	}
	defer s.Close()
	n, err := node.New(s, node.Config{NodeID: "coldstart", AllBuckets: true, Logger: zap.NewNop()})
	if err != nil {
		return result{}, err
	}
	n.Register(kind, func(context.Context, *task.Task) error {
		at := time.Since(t0)
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, at)
		if len(starts) == 1000 {
			close(done)
		}
		return nil
	})
	if err := n.Start(ctx); err != nil {
		return result{}, err
	}
	r.startup = time.Since(t0)
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		return result{}, fmt.Errorf("the node did not start 1,000 tasks in 2 minutes")
	}
	_ = n.Shutdown(ctx)
	mu.Lock()
	first := slices.Clone(starts[:1000])
	mu.Unlock()
	slices.Sort(first)
	r.first, r.hundredth, r.thousandth = first[0], first[99], first[999]
	for i := 1; i < len(first); i++ {
		r.longestGap = max(r.longestGap, first[i]-first[i-1])
	}
	return r, nil
}

// idle starts a node on the fleet, empty, and notes what it holds once
// started.
func idle(ctx context.Context, admin, name string, r *result) error {
	t0 := time.Now()
	s, err := postgres.New(ctx, withDatabase(admin, name))
	if err != nil {
		return err
	}
	defer s.Close()
	n, err := node.New(s, node.Config{NodeID: "idle", AllBuckets: true, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	n.Register(kind, func(context.Context, *task.Task) error { return nil })
	if err := n.Start(ctx); err != nil {
		return err
	}
	r.idleStartup = time.Since(t0)
	r.idleConns, err = backends(ctx, admin, name)
	r.idleRSSKB = rss()
	_ = n.Shutdown(ctx)
	return err
}

// queue adds backlog tasks through a store of its own, closed before the
// node starts.
func queue(ctx context.Context, dsn string, backlog int) error {
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer s.Close()
	meta, err := s.Migrate(ctx, 0)
	if err != nil {
		return err
	}
	policy, err := bucket.NewPolicy(meta.NumBuckets)
	if err != nil {
		return err
	}
	for start := 0; start < backlog; start += 1000 {
		var batch []store.NewTask
		for i := start; i < min(backlog, start+1000); i++ {
			key := "k" + strconv.Itoa(i)
			batch = append(batch, store.NewTask{Kind: kind, Key: key, Bucket: policy.Of(key)})
		}
		if _, err := s.CreateTasks(ctx, batch); err != nil {
			return err
		}
	}
	return nil
}

// backends counts the connections open to database name.
func backends(ctx context.Context, admin, name string) (int, error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, name).Scan(&n)
	return n, err
}

// rss is the process's resident set in KiB.
func rss() int {
	b, _ := os.ReadFile("/proc/self/status")
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

func adminExec(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, sql)
	return err
}

// withDatabase returns dsn (a URL) naming database name instead.
func withDatabase(dsn, name string) string {
	head, query, _ := strings.Cut(dsn, "?")
	if i := strings.Index(head, "://"); i >= 0 {
		rest := head[i+3:]
		if j := strings.Index(rest, "/"); j >= 0 {
			head = head[:i+3] + rest[:j]
		}
	}
	out := head + "/" + name
	if query != "" {
		out += "?" + query
	}
	return out
}
