// Command compare runs flotilla and River side by side on one PostgreSQL
// server (or, with -sqlite, on SQLite files: the bulk insert and the
// burn-down): the same workloads, one system after the other within each run,
// each workload of each system in a fresh database. It prints Go benchmark
// lines that benchstat reads on stdout, and a summary (medians, spread and
// the flotilla / River ratio against each target) on stderr. With -charts
// DIR it saves the results as DIR/data/compare.json and redraws the charts
// of DIR (package charts); make charts redraws them from the saved data.
//
//	go run ./cmd/compare -runs 3 > compare.txt 2> summary.txt
//	benchstat -col /system compare.txt
//
// The server is -dsn, or FLOTILLA_TEST_DSN; its role must be allowed to
// create databases.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

type options struct {
	dsn          string
	runs         int
	insertJobs   int
	insertBatch  int
	burnJobs     int
	defaultJobs  int
	latencyJobs  int
	latencyRate  int
	idleJobs     int
	cancelJobs   int
	only         string
	concurrency  int
	cpuProfile   string
	riverProfile string
	sqlite       bool
	charts       string
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", os.Getenv("FLOTILLA_TEST_DSN"), "PostgreSQL server to create the benchmark databases on (default $FLOTILLA_TEST_DSN)")
	flag.IntVar(&o.runs, "runs", 3, "runs of every workload, alternating the systems")
	flag.IntVar(&o.insertJobs, "insert-jobs", 200_000, "jobs of the bulk insert")
	flag.IntVar(&o.insertBatch, "insert-batch", benchmark.DefaultInsertBatch, "jobs per bulk insert call")
	flag.IntVar(&o.burnJobs, "burn-jobs", 200_000, "jobs of the burn-down with each system's best settings")
	flag.IntVar(&o.defaultJobs, "default-jobs", 200_000, "jobs of the burn-down with each system's defaults")
	flag.IntVar(&o.latencyJobs, "latency-jobs", 20_000, "single inserts of the paced start-latency run")
	flag.IntVar(&o.latencyRate, "latency-rate", 1000, "single inserts per second of the paced start-latency run")
	flag.IntVar(&o.idleJobs, "idle-jobs", 500, "jobs of the idle pickup run, one at a time")
	flag.IntVar(&o.cancelJobs, "cancel-jobs", 100, "running jobs cancelled, one at a time")
	flag.IntVar(&o.concurrency, "flotilla-concurrency", benchmark.BestConcurrency, "flotilla's node concurrency with its best settings")
	flag.StringVar(&o.only, "only", "", "comma-separated workloads to run (insert, burndown, default, latency, idle, cancel); default all")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of flotilla's best burn-down in the first run to this file")
	flag.StringVar(&o.riverProfile, "river-cpuprofile", "", "write a CPU profile of River's best burn-down in the first run to this file")
	flag.BoolVar(&o.sqlite, "sqlite", false, "run the bulk insert and the burn-down on SQLite files (River's riversqlite) instead of PostgreSQL; needs no -dsn")
	flag.StringVar(&o.charts, "charts", "", "save the results into DIR/data/compare.json (replacing the saved figures of the workloads run) and redraw the SVG charts of DIR (e.g. ../docs/charts)")
	flag.Parse()
	if o.dsn == "" && !o.sqlite {
		fmt.Fprintln(os.Stderr, "compare: give -dsn or set FLOTILLA_TEST_DSN (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
		os.Exit(2)
	}
	for name, v := range map[string]int{
		"runs": o.runs, "insert-jobs": o.insertJobs, "insert-batch": o.insertBatch, "burn-jobs": o.burnJobs,
		"default-jobs": o.defaultJobs, "latency-jobs": o.latencyJobs, "latency-rate": o.latencyRate,
		"idle-jobs": o.idleJobs, "cancel-jobs": o.cancelJobs, "flotilla-concurrency": o.concurrency,
	} {
		if v < 1 {
			fmt.Fprintf(os.Stderr, "compare: -%s %d: it must be at least 1\n", name, v)
			os.Exit(2)
		}
	}
	if o.charts != "" {
		if err := checkChartsDir(o.charts); err != nil {
			fmt.Fprintln(os.Stderr, "compare:", err)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res := &results{}
	runner := run
	if o.sqlite {
		runner = runSQLite
	}
	if err := runner(ctx, o, os.Stdout, os.Stderr, res); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
	res.summary(os.Stderr)
	if o.charts != "" {
		written, err := saveCharts(o.charts, o.dsn, res)
		if err != nil {
			fmt.Fprintln(os.Stderr, "compare: charts:", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "\ncharts: %s\n", strings.Join(written, " "))
	}
}

func (o options) want(workload string) bool {
	if o.only == "" {
		return true
	}
	for _, w := range strings.Split(o.only, ",") {
		if strings.TrimSpace(w) == workload {
			return true
		}
	}
	return false
}

// header prints the configuration lines benchstat keeps with the results.
func header(w io.Writer, dsn string) {
	fmt.Fprintf(w, "goos: %s\ngoarch: %s\npkg: github.com/flotilla-dev/flotilla/bench\n", runtime.GOOS, runtime.GOARCH)
	if cpu := cpuModel(); cpu != "" {
		fmt.Fprintf(w, "cpu: %s\n", cpu)
	}
	if dsn == "" {
		return
	}
	if v := serverVersion(dsn); v != "" {
		fmt.Fprintf(w, "postgres: %s\n", v)
	}
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func serverVersion(dsn string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return ""
	}
	defer func() { _ = conn.Close(ctx) }()
	var v string
	_ = conn.QueryRow(ctx, `SHOW server_version`).Scan(&v)
	return v
}

func run(ctx context.Context, o options, out, log io.Writer, res *results) error {
	header(out, o.dsn)
	fmt.Fprintf(log, "compare: %d runs on %s\n", o.runs, where(o.dsn))
	for r := 1; r <= o.runs; r++ {
		first := r == 1
		steps := []struct {
			workload string
			fn       func() error
		}{
			{"insert", func() error { return benchInsert(ctx, o, res) }},
			{"burndown", func() error { return benchBurnDown(ctx, o, res, "best", o.burnJobs, first) }},
			{"default", func() error { return benchBurnDown(ctx, o, res, "default", o.defaultJobs, false) }},
			{"latency", func() error { return benchLatency(ctx, o, res) }},
			{"idle", func() error { return benchIdle(ctx, o, res) }},
			{"cancel", func() error { return benchCancel(ctx, o, res) }},
		}
		for _, s := range steps {
			if !o.want(s.workload) {
				continue
			}
			fmt.Fprintf(log, "compare: run %d: %s\n", r, s.workload)
			if err := s.fn(); err != nil {
				return fmt.Errorf("run %d, %s: %w", r, s.workload, err)
			}
			res.flush(out)
		}
	}
	return nil
}

// database is a fresh database on the server, dropped by drop.
type database struct {
	admin, dsn, name string
}

func newDatabase(ctx context.Context, admin string) (*database, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "flotilla_bench_" + hex.EncodeToString(b[:])
	if _, err := pgx.ParseConfig(admin); err != nil {
		return nil, fmt.Errorf("invalid -dsn: %w", err)
	}
	if err := adminExec(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0"); err != nil {
		return nil, fmt.Errorf("create database %s on %s: %w", name, where(admin), err)
	}
	return &database{admin: admin, dsn: withDatabase(admin, name), name: name}, nil
}

func (d *database) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = adminExec(ctx, d.admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.name}.Sanitize()+" WITH (FORCE)")
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

// where names the server of a DSN, without its user or password.
func where(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "the server"
	}
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}

// flotillaFleet makes a fresh migrated fleet and opens it.
func flotillaFleet(ctx context.Context, admin string) (*database, *postgres.Store, error) {
	db, err := newDatabase(ctx, admin)
	if err != nil {
		return nil, nil, err
	}
	s, err := postgres.New(ctx, db.dsn)
	if err != nil {
		db.drop()
		return nil, nil, err
	}
	if _, err := s.Migrate(ctx, 0); err != nil {
		s.Close()
		db.drop()
		return nil, nil, err
	}
	return db, s, nil
}

func riverDatabase(ctx context.Context, admin string) (*database, error) {
	db, err := newDatabase(ctx, admin)
	if err != nil {
		return nil, err
	}
	if err := riverMigrate(ctx, db.dsn); err != nil {
		db.drop()
		return nil, err
	}
	return db, nil
}

func benchInsert(ctx context.Context, o options, res *results) error {
	// flotilla: CreateTasks, COPY from 100 tasks.
	db, s, err := flotillaFleet(ctx, o.dsn)
	if err != nil {
		return err
	}
	ir, err := benchmark.Insert(ctx, s, o.insertJobs, o.insertBatch, nil)
	s.Close()
	db.drop()
	if err != nil {
		return err
	}
	res.add("BulkInsert", "flotilla", "", o.insertJobs, ir.Elapsed, "jobs/s", ir.JobsPerSecond())

	for _, fast := range []bool{true, false} {
		rdb, err := riverDatabase(ctx, o.dsn)
		if err != nil {
			return err
		}
		d, err := riverInsert(ctx, rdb.dsn, o.insertJobs, o.insertBatch, fast)
		rdb.drop()
		if err != nil {
			return err
		}
		name := "BulkInsert"
		if !fast {
			name = "BulkInsertMany"
		}
		res.add(name, "river", "", o.insertJobs, d, "jobs/s", benchmark.PerSecond(o.insertJobs, d))
	}
	return nil
}

// settle closes what ran and waits for PostgreSQL to publish the exited
// backends' counters before they are read.
func settle() { time.Sleep(1500 * time.Millisecond) }

func benchBurnDown(ctx context.Context, o options, res *results, settings string, jobs int, profile bool) error {
	// flotilla
	db, s, err := flotillaFleet(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer db.drop()
	if _, err := benchmark.Insert(ctx, s, jobs, 10_000, nil); err != nil {
		s.Close()
		return err
	}
	if err := benchmark.Analyze(ctx, s); err != nil {
		s.Close()
		return err
	}
	s.Close()
	settle()
	before, err := benchmark.ReadDBStats(ctx, db.dsn)
	if err != nil {
		return err
	}
	s, err = postgres.New(ctx, db.dsn)
	if err != nil {
		return err
	}
	cfg := node.Config{NodeID: "bench"}
	if settings == "best" {
		cfg.Concurrency = o.concurrency
	}
	stopProfile := startProfile(profile, o.cpuProfile)
	bd, err := benchmark.BurnDown(ctx, s, jobs, cfg, nil)
	stopProfile()
	s.Close()
	if err != nil {
		return err
	}
	settle()
	after, err := benchmark.ReadDBStats(ctx, db.dsn)
	if err != nil {
		return err
	}
	st := after.Sub(before)
	res.add("BurnDown", "flotilla", settings, jobs, bd.Elapsed, "jobs/s", bd.JobsPerSecond(),
		append(statMetrics(st, jobs, bd.Calls),
			metric{"server-cpu-us/job", perJobMicros(bd.ServerCPU, jobs)},
			metric{"client-cpu-us/job", perJobMicros(bd.ClientCPU, jobs)})...)

	// River
	rdb, err := riverDatabase(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer rdb.drop()
	if _, err := riverInsert(ctx, rdb.dsn, jobs, 10_000, true); err != nil {
		return err
	}
	settle()
	rbefore, err := benchmark.ReadDBStats(ctx, rdb.dsn)
	if err != nil {
		return err
	}
	st2 := riverBest
	if settings == "default" {
		st2 = riverDefault
	}
	stopProfile = startProfile(profile, o.riverProfile)
	rr, err := riverBurnDown(ctx, rdb.dsn, jobs, st2)
	stopProfile()
	if err != nil {
		return err
	}
	settle()
	rafter, err := benchmark.ReadDBStats(ctx, rdb.dsn)
	if err != nil {
		return err
	}
	res.add("BurnDown", "river", settings, jobs, rr.elapsed, "jobs/s", benchmark.PerSecond(jobs, rr.elapsed),
		append(statMetrics(rafter.Sub(rbefore), jobs, benchmark.CallCounts{}),
			metric{"statements/job", float64(rr.statements) / float64(jobs)},
			metric{"server-cpu-us/job", perJobMicros(rr.serverCPU, jobs)},
			metric{"client-cpu-us/job", perJobMicros(rr.clientCPU, jobs)})...)
	return nil
}

func perJobMicros(d time.Duration, jobs int) float64 {
	return float64(d.Nanoseconds()) / 1000 / float64(jobs)
}

// statMetrics turns database counters into per-job figures.
func statMetrics(st benchmark.DBStats, jobs int, calls benchmark.CallCounts) []metric {
	per := func(v int64) float64 { return float64(v) / float64(jobs) }
	ms := []metric{
		{"commits/job", per(st.Commits)},
		{"rows-inserted/job", per(st.Inserted)},
		{"rows-updated/job", per(st.Updated)},
		{"rows-deleted/job", per(st.Deleted)},
	}
	if calls.Claims > 0 {
		ms = append(ms,
			metric{"tasks/claim", float64(calls.ClaimedTasks) / float64(calls.Claims)},
			metric{"tasks/write", float64(calls.AdvancedTasks) / float64(max(1, calls.Advances))},
			metric{"claim-us/task", float64(calls.ClaimPerTask().Nanoseconds()) / 1000},
			metric{"write-us/task", float64(calls.AdvanceTime.Nanoseconds()) / 1000 / float64(max(1, calls.AdvancedTasks))},
			// A claim is one round trip of four statements (BEGIN, its
			// settings, the claim, COMMIT); an outcome write is one, and a
			// lease renewal one. The rest (bucket leases, heartbeats,
			// command polls) are per node, not per task.
			metric{"hot-statements/job", float64(4*calls.Claims+calls.Advances+calls.Renewals) / float64(jobs)},
		)
	}
	return ms
}

func startProfile(on bool, file string) func() {
	if !on || file == "" {
		return func() {}
	}
	f, err := os.Create(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare: cpu profile:", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, "compare: cpu profile:", err)
		_ = f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

func latencyMetrics(p benchmark.Percentiles) (float64, []metric) {
	return benchmark.Millis(p.P50), []metric{
		{"p90-ms", benchmark.Millis(p.P90)},
		{"p99-ms", benchmark.Millis(p.P99)},
		{"max-ms", benchmark.Millis(p.Max)},
	}
}

func benchLatencyWith(ctx context.Context, o options, res *results, name string, lc benchmark.LatencyConfig) error {
	db, s, err := flotillaFleet(ctx, o.dsn)
	if err != nil {
		return err
	}
	p, err := benchmark.StartLatency(ctx, s, node.Config{NodeID: "bench"}, lc, nil)
	s.Close()
	db.drop()
	if err != nil {
		return err
	}
	p50, more := latencyMetrics(p)
	res.add(name, "flotilla", "default", lc.Jobs, 0, "p50-ms", p50, more...)
	for _, st := range []riverSettings{riverDefault, riverBest} {
		rdb, err := riverDatabase(ctx, o.dsn)
		if err != nil {
			return err
		}
		p, err := riverStartLatency(ctx, rdb.dsn, st, lc)
		rdb.drop()
		if err != nil {
			return err
		}
		p50, more := latencyMetrics(p)
		res.add(name, "river", st.name, lc.Jobs, 0, "p50-ms", p50, more...)
	}
	return nil
}

func benchLatency(ctx context.Context, o options, res *results) error {
	return benchLatencyWith(ctx, o, res, "StartLatency", benchmark.LatencyConfig{Jobs: o.latencyJobs, Rate: o.latencyRate})
}

func benchIdle(ctx context.Context, o options, res *results) error {
	return benchLatencyWith(ctx, o, res, "IdlePickup", benchmark.LatencyConfig{Jobs: o.idleJobs})
}

func benchCancel(ctx context.Context, o options, res *results) error {
	db, s, err := flotillaFleet(ctx, o.dsn)
	if err != nil {
		return err
	}
	p, err := benchmark.StopToCancel(ctx, s, node.Config{NodeID: "bench"}, o.cancelJobs, nil)
	s.Close()
	db.drop()
	if err != nil {
		return err
	}
	p50, more := latencyMetrics(p)
	res.add("Cancel", "flotilla", "default", o.cancelJobs, 0, "p50-ms", p50, more...)
	rdb, err := riverDatabase(ctx, o.dsn)
	if err != nil {
		return err
	}
	p, err = riverCancel(ctx, rdb.dsn, riverDefault, o.cancelJobs)
	rdb.drop()
	if err != nil {
		return err
	}
	p50, more = latencyMetrics(p)
	res.add("Cancel", "river", "default", o.cancelJobs, 0, "p50-ms", p50, more...)
	return nil
}
