package benchmark

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// StallTimeout is how long a workload waits without any progress before it
// gives up: a node that cannot get its buckets, or a database that stopped
// answering, ends the run with an error instead of hanging it.
const StallTimeout = time.Minute

// BurnDownResult is the outcome of a burn-down.
type BurnDownResult struct {
	Jobs    int
	Nodes   int
	Elapsed time.Duration // from the first node's start to the last completion
	Calls   CallCounts
	// ServerCPU is the CPU time the database's backends used meanwhile
	// (zero where it cannot be read: see ReadBackendCPU), ClientCPU this
	// process's.
	ServerCPU, ClientCPU time.Duration
}

// JobsPerSecond is the burn-down rate.
func (r BurnDownResult) JobsPerSecond() float64 { return PerSecond(r.Jobs, r.Elapsed) }

// CallCounts counts the hot-path store calls of a run and the time they
// took, as the nodes made them.
type CallCounts struct {
	Claims        int64         // ClaimTasks calls
	ClaimedTasks  int64         // tasks they returned
	ClaimTime     time.Duration // spent in ClaimTasks
	Advances      int64         // AdvanceActive calls (outcome writes)
	AdvancedTasks int64         // outcomes they carried
	AdvanceTime   time.Duration // spent in AdvanceActive
	Renewals      int64         // RenewTaskLeases calls
}

// ClaimPerTask is the time spent claiming, per task claimed.
func (c CallCounts) ClaimPerTask() time.Duration {
	if c.ClaimedTasks == 0 {
		return 0
	}
	return c.ClaimTime / time.Duration(c.ClaimedTasks)
}

// countingStore counts the hot-path calls of the nodes using it and the
// tasks that succeeded. It embeds the store with its notifications
// (Listen), so that they reach the nodes as they would without it.
type countingStore struct {
	Store

	claims, claimed, claimNanos      atomic.Int64
	advances, advanced, advanceNanos atomic.Int64
	renewals                         atomic.Int64
	succeeded                        atomic.Int64 // len(succeededIDs)
	// progress is poked after every write that recorded a success.
	progress chan struct{}

	mu sync.Mutex
	// succeededIDs are the tasks an answer said had succeeded. A write
	// whose answer was lost (its deadline passed as it committed) is
	// written again by the node and answered as fenced, with the task
	// succeeded: counting tasks, not answers, counts it once either way.
	succeededIDs map[int64]struct{}
}

func newCountingStore(s Store) *countingStore {
	return &countingStore{Store: s, progress: make(chan struct{}, 1), succeededIDs: map[int64]struct{}{}}
}

func (c *countingStore) ClaimTasks(ctx context.Context, req store.ClaimRequest) ([]*task.Task, error) {
	t0 := time.Now()
	out, err := c.Store.ClaimTasks(ctx, req)
	c.claimNanos.Add(int64(time.Since(t0)))
	c.claims.Add(1)
	c.claimed.Add(int64(len(out)))
	return out, err
}

func (c *countingStore) AdvanceActive(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	t0 := time.Now()
	out, err := c.Store.AdvanceActive(ctx, owner, batch)
	c.advanceNanos.Add(int64(time.Since(t0)))
	c.advances.Add(1)
	c.advanced.Add(int64(len(batch)))
	c.count(out)
	return out, err
}

// AdvanceAndClaimLimited counts as AdvanceActive does; its claim is
// counted with the write.
func (c *countingStore) AdvanceAndClaimLimited(ctx context.Context, owner string, batch []store.ActiveTransition,
	req store.ClaimRequest, lc store.LimitedClaim) ([]store.Outcome, []*task.Task, error) {
	t0 := time.Now()
	out, claimed, err := c.Store.AdvanceAndClaimLimited(ctx, owner, batch, req, lc)
	c.advanceNanos.Add(int64(time.Since(t0)))
	if out != nil {
		c.advances.Add(1)
		c.advanced.Add(int64(len(batch)))
	}
	c.count(out)
	return out, claimed, err
}

// count notes the tasks out says succeeded, each once.
func (c *countingStore) count(out []store.Outcome) {
	var ok int
	c.mu.Lock()
	for _, o := range out {
		if _, seen := c.succeededIDs[o.ID]; !seen && o.Status == task.Succeeded {
			c.succeededIDs[o.ID] = struct{}{}
			ok++
		}
	}
	c.succeeded.Store(int64(len(c.succeededIDs)))
	c.mu.Unlock()
	if ok > 0 {
		select {
		case c.progress <- struct{}{}:
		default:
		}
	}
}

func (c *countingStore) RenewTaskLeases(ctx context.Context, owner string, refs []task.Ref, ttl time.Duration) (store.Renewal, error) {
	c.renewals.Add(1)
	return c.Store.RenewTaskLeases(ctx, owner, refs, ttl)
}

func (c *countingStore) counts() CallCounts {
	return CallCounts{
		Claims: c.claims.Load(), ClaimedTasks: c.claimed.Load(), ClaimTime: time.Duration(c.claimNanos.Load()),
		Advances: c.advances.Load(), AdvancedTasks: c.advanced.Load(), AdvanceTime: time.Duration(c.advanceNanos.Load()),
		Renewals: c.renewals.Load(),
	}
}

// waitSucceeded waits until want tasks have succeeded, calling progress on
// the way, and returns when the last one was recorded.
func (c *countingStore) waitSucceeded(ctx context.Context, want int, progress func(done int)) (time.Time, error) {
	stall := time.NewTimer(StallTimeout)
	defer stall.Stop()
	last := int64(-1)
	for {
		done := c.succeeded.Load()
		if done != last {
			last = done
			if progress != nil {
				progress(int(min(done, int64(want))))
			}
			stall.Reset(StallTimeout)
		}
		if done >= int64(want) {
			return time.Now(), nil
		}
		select {
		case <-c.progress:
		case <-stall.C:
			return time.Time{}, fmt.Errorf("no task finished for %v (%d of %d done)", StallTimeout, done, want)
		case <-ctx.Done():
			return time.Time{}, context.Cause(ctx)
		}
	}
}

// BurnDown runs the backlog of jobs no-op tasks, inserted beforehand (see
// Insert), on one node in this process that holds every bucket, configured
// by cfg (its zero fields take node's defaults; AllBuckets is set). It
// analyzes the task table first; the clock runs from the node's start to
// the last recorded success. progress, when not nil, is called with the
// number of tasks done so far.
func BurnDown(ctx context.Context, s Store, jobs int, cfg node.Config, progress func(done int)) (BurnDownResult, error) {
	cfg.AllBuckets, cfg.Buckets = true, bucket.Set{}
	return burnDown(ctx, s, jobs, []node.Config{cfg}, progress)
}

// BurnDownSpread is BurnDown with nodes nodes in this process, sharing the
// store (and so its connection pool), each declaring an equal share of the
// fleet's buckets in contiguous ranges.
func BurnDownSpread(ctx context.Context, s Store, jobs, nodes int, cfg node.Config, progress func(done int)) (BurnDownResult, error) {
	meta, err := s.Meta(ctx)
	if err != nil {
		return BurnDownResult{}, err
	}
	if nodes <= 0 || nodes > meta.NumBuckets {
		return BurnDownResult{}, fmt.Errorf("burn-down: %d nodes for %d buckets; give 1 to %d", nodes, meta.NumBuckets, meta.NumBuckets)
	}
	cfgs := make([]node.Config, nodes)
	for i := range cfgs {
		lo, hi := i*meta.NumBuckets/nodes, (i+1)*meta.NumBuckets/nodes-1
		set, err := bucket.ParseSet(fmt.Sprintf("%d-%d", lo, hi), meta.NumBuckets)
		if err != nil {
			return BurnDownResult{}, err
		}
		c := cfg
		c.AllBuckets, c.Buckets = false, set
		if c.NodeID == "" {
			c.NodeID = fmt.Sprintf("bench-%d", i)
		} else {
			c.NodeID = fmt.Sprintf("%s-%d", c.NodeID, i)
		}
		cfgs[i] = c
	}
	return burnDown(ctx, s, jobs, cfgs, progress)
}

func burnDown(ctx context.Context, s Store, jobs int, cfgs []node.Config, progress func(done int)) (BurnDownResult, error) {
	if jobs <= 0 {
		return BurnDownResult{}, fmt.Errorf("burn-down: %d jobs; give at least 1", jobs)
	}
	if err := Analyze(ctx, s); err != nil {
		return BurnDownResult{}, err
	}
	cs := newCountingStore(s)
	nodes := make([]*node.Node, 0, len(cfgs))
	defer func() {
		for _, n := range nodes {
			_ = n.Shutdown(context.WithoutCancel(ctx))
		}
	}()
	for _, cfg := range cfgs {
		if cfg.Logger == nil {
			cfg.Logger = zap.NewNop()
		}
		n, err := node.New(cs, cfg)
		if err != nil {
			return BurnDownResult{}, err
		}
		n.Register(Kind, kinds.Noop)
		nodes = append(nodes, n)
	}
	// The server's CPU is PostgreSQL's backends'; SQLite runs in this
	// process, where ClientCPU counts it.
	pg, onPostgres := s.(*postgres.Store)
	var (
		serverBefore BackendCPU
		cpuErr       = errors.New("no database server")
	)
	if onPostgres {
		serverBefore, cpuErr = ReadBackendCPU(ctx, pg.Pool())
	}
	clientBefore := ProcessCPU()
	start := time.Now()
	for i, n := range nodes {
		if err := n.Start(ctx); err != nil {
			nodes = nodes[:i]
			return BurnDownResult{}, fmt.Errorf("burn-down: start node %s: %w", n.ID(), err)
		}
	}
	end, err := cs.waitSucceeded(ctx, jobs, progress)
	if err != nil {
		return BurnDownResult{}, fmt.Errorf("burn-down: %w", err)
	}
	r := BurnDownResult{Jobs: jobs, Nodes: len(cfgs), Elapsed: end.Sub(start), ClientCPU: ProcessCPU() - clientBefore}
	if cpuErr == nil {
		if after, err := ReadBackendCPU(ctx, pg.Pool()); err == nil {
			r.ServerCPU = after.Since(serverBefore)
		}
	}
	var errs []error
	for _, n := range nodes {
		errs = append(errs, n.Shutdown(context.WithoutCancel(ctx)))
	}
	nodes = nil
	if err := errors.Join(errs...); err != nil {
		return BurnDownResult{}, fmt.Errorf("burn-down: shutdown: %w", err)
	}
	r.Calls = cs.counts()
	return r, nil
}
