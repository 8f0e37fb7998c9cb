package benchmark

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// Defaults of Config: flotilla's best settings for the burn-down, and the
// paced single-insert run of the start latency.
const (
	// BestConcurrency is the node concurrency the burn-down runs with by
	// default. A node's slots are shared between the tasks of the claim in
	// flight, those running, and those whose outcome waits for or is in
	// the outcome write; with no-op handlers they split about evenly
	// between the claim and the write, so 3,000 slots let each claim
	// take the most one claim may (1,000) and each write carry 800-1,000.
	// Measured on PostgreSQL 15, 100,000 tasks: 1,000 slots claim about
	// 380 tasks at a time and cost 35-45 µs of database CPU per task;
	// 2,000 to 5,000 slots cost 32-36 µs, and burn down 20-25% faster.
	BestConcurrency = 3000
	// DefaultLatencyRate is the single inserts per second of the latency
	// run.
	DefaultLatencyRate = 1000
	// DefaultLatencyJobs is the most tasks the latency run submits (fewer
	// when Jobs is smaller): five seconds at the default rate.
	DefaultLatencyJobs = 5000
)

// Phase names a step of Run, for progress reports.
type Phase string

// The phases of Run, in order.
const (
	PhaseInsert   Phase = "insert"
	PhaseBurnDown Phase = "burn-down"
	PhaseLatency  Phase = "start latency"
)

// Config configures Run. Zero fields take the defaults above.
type Config struct {
	// Jobs is the number of no-op tasks inserted and burnt down.
	Jobs int
	// Concurrency is the burn-down node's concurrency (BestConcurrency).
	Concurrency int
	// InsertBatch is the number of tasks per insert (DefaultInsertBatch).
	InsertBatch int
	// LatencyJobs and LatencyRate shape the start-latency run: LatencyJobs
	// single inserts at LatencyRate a second, on a node with default
	// settings.
	LatencyJobs int
	LatencyRate int
	// Logger receives the nodes' logs (default: none).
	Logger *zap.Logger
	// Progress, when not nil, is told how far each phase has come.
	Progress func(phase Phase, done, total int)
}

// withDefaults fills in the zero fields.
func (c Config) withDefaults() Config {
	if c.Concurrency == 0 {
		c.Concurrency = BestConcurrency
	}
	if c.InsertBatch == 0 {
		c.InsertBatch = DefaultInsertBatch
	}
	if c.LatencyRate == 0 {
		c.LatencyRate = DefaultLatencyRate
	}
	if c.LatencyJobs == 0 {
		c.LatencyJobs = min(c.Jobs, DefaultLatencyJobs)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

// Validate refuses a configuration Run cannot work with, naming the field,
// its value and what is valid.
func (c Config) Validate() error {
	switch {
	case c.Jobs <= 0:
		return fmt.Errorf("jobs is %d; it must be at least 1", c.Jobs)
	case c.Concurrency < 0:
		return fmt.Errorf("concurrency is %d; it must be positive (or zero for %d)", c.Concurrency, BestConcurrency)
	case c.InsertBatch < 0:
		return fmt.Errorf("insert batch is %d; it must be positive (or zero for %d)", c.InsertBatch, DefaultInsertBatch)
	case c.LatencyJobs < 0:
		return fmt.Errorf("latency jobs is %d; it must be positive (or zero for min(jobs, %d))", c.LatencyJobs, DefaultLatencyJobs)
	case c.LatencyRate < 0:
		return fmt.Errorf("latency rate is %d per second; it must be positive (or zero for %d)", c.LatencyRate, DefaultLatencyRate)
	}
	return nil
}

// Report is what Run measured.
type Report struct {
	Jobs        int
	Concurrency int
	Insert      InsertResult
	BurnDown    BurnDownResult
	LatencyRate int
	Latency     Percentiles
}

// ErrFleetBusy matches the refusal to run on a fleet that has live nodes or
// unfinished tasks: they would take part in, or skew, the measurement.
var ErrFleetBusy = errors.New("the fleet is in use")

// Run measures the fleet s points at (migrated): it inserts cfg.Jobs no-op
// tasks in bulk, burns them down on one node in this process holding every
// bucket, then measures the start latency of single inserts at a fixed
// rate on a node with default settings. The fleet must have no live node
// and no unfinished task (ErrFleetBusy); the tasks it creates are left
// behind, finished.
func Run(ctx context.Context, s Store, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	cfg = cfg.withDefaults()
	if err := checkIdle(ctx, s); err != nil {
		return Report{}, err
	}
	progress := func(p Phase, total int) func(int) {
		if cfg.Progress == nil {
			return nil
		}
		return func(done int) { cfg.Progress(p, done, total) }
	}
	r := Report{Jobs: cfg.Jobs, Concurrency: cfg.Concurrency, LatencyRate: cfg.LatencyRate}
	var err error
	if r.Insert, err = Insert(ctx, s, cfg.Jobs, cfg.InsertBatch, progress(PhaseInsert, cfg.Jobs)); err != nil {
		return Report{}, err
	}
	nodeCfg := node.Config{NodeID: "bench", Concurrency: cfg.Concurrency, Logger: cfg.Logger}
	if r.BurnDown, err = BurnDown(ctx, s, cfg.Jobs, nodeCfg, progress(PhaseBurnDown, cfg.Jobs)); err != nil {
		return Report{}, err
	}
	// The burn-down left a dead row version per job. Autovacuum would clean
	// them up during the latency run and show up in its tail; cleaning them
	// first measures the inserts and starts alone.
	// (SQLite has no dead row versions: it rewrites rows in place.)
	if pg, ok := s.(*postgres.Store); ok {
		if _, err := pg.Pool().Exec(ctx, `VACUUM (ANALYZE) flotilla_tasks`); err != nil {
			return Report{}, fmt.Errorf("vacuum the task table after the burn-down: %w", err)
		}
	}
	lc := LatencyConfig{Jobs: cfg.LatencyJobs, Rate: cfg.LatencyRate}
	latencyCfg := node.Config{NodeID: "bench", Logger: cfg.Logger}
	if r.Latency, err = StartLatency(ctx, s, latencyCfg, lc, progress(PhaseLatency, cfg.LatencyJobs)); err != nil {
		return Report{}, err
	}
	return r, nil
}

// checkIdle refuses a fleet with a live node or an unfinished task.
func checkIdle(ctx context.Context, s Store) error {
	nodes, err := s.ListNodes(ctx)
	if err != nil {
		return err
	}
	var live []string
	for _, n := range nodes {
		if n.Alive {
			live = append(live, n.ID)
		}
	}
	if len(live) > 0 {
		return fmt.Errorf("%w: live nodes %s would run the benchmark's tasks; "+
			"run it on a fleet of its own (a database nobody else uses)", ErrFleetBusy, strings.Join(live, ", "))
	}
	backlog, err := s.BucketBacklog(ctx)
	if err != nil {
		return err
	}
	unfinished := 0
	for _, b := range backlog {
		unfinished += b.Queued + b.Waiting + b.Active
	}
	if unfinished > 0 {
		return fmt.Errorf("%w: %d unfinished tasks would be run with the benchmark's; "+
			"run it on a fleet of its own (a database nobody else uses)", ErrFleetBusy, unfinished)
	}
	return nil
}
