// Package rollup counts the attempts a node ends, per minute, kind and
// state, and adds the counts to the store every few seconds: what the
// dashboard's charts of throughput and failures, and its counts of the last
// hour, read. The task table is never scanned for them, and no row is
// written per task: a node writes one row per minute, kind and state it saw,
// into rows of its own (store.AddMinuteCounts), so no two nodes contend.
//
//	rec := rollup.New(s, rollup.Options{Next: promMetrics})
//	cfg.Metrics = rec // node.Config
//	n, _ := node.New(s, cfg)
//	_ = rec.Start(ctx, n.ID())
//	defer rec.Stop()
//
// A Recorder is a node.Metrics: it counts what the completer wrote
// (Flushed) and what reconcile moved (Rescued), and passes every call on to
// Options.Next, the optional ones too (node.LimitMetrics, and /metrics as an
// http.Handler), so that it can stand where Next stood. The minute is the node's clock's. Counts not yet written
// when a node dies are lost (at most Options.Every of them); a write that
// fails is tried again with the next one, and counts older than the store
// keeps (store.MinuteCountsKept) are dropped.
package rollup

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/reconcile"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// DefaultEvery is how often counts are written.
const DefaultEvery = 5 * time.Second

// maxPending bounds the counts kept while the store cannot be written: a
// day of minutes for a few dozen kinds and states.
const maxPending = 100_000

// Options configures a Recorder.
type Options struct {
	// Next receives every call the Recorder gets (nil: none).
	Next node.Metrics
	// Every is how often counts are written (DefaultEvery).
	Every time.Duration
	// Now is the clock the minutes are read from (time.Now).
	Now func() time.Time
	// Logger receives a line per failed write (default: none).
	Logger *zap.Logger
}

type key struct {
	minute time.Time
	kind   string
	status task.Status
}

// Recorder counts ended attempts and writes the counts. Start it once the
// node has its id; Stop writes what is left.
type Recorder struct {
	store store.Store
	opts  Options

	mu      sync.Mutex
	pending map[key]int

	nodeID string
	stop   context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

var (
	_ node.Metrics      = (*Recorder)(nil)
	_ node.LimitMetrics = (*Recorder)(nil)
	_ http.Handler      = (*Recorder)(nil)
)

// New returns a Recorder for s.
func New(s store.Store, opts Options) *Recorder {
	if opts.Every <= 0 {
		opts.Every = DefaultEvery
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	return &Recorder{store: s, opts: opts, pending: map[key]int{}}
}

func (r *Recorder) count(kind string, to task.Status, n int) {
	if kind == "" || !to.Valid() {
		return
	}
	k := key{minute: r.opts.Now().UTC().Truncate(time.Minute), kind: kind, status: to}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.pending[k]; !ok && len(r.pending) >= maxPending {
		return // the store has been unreachable for long: keep what is counted
	}
	r.pending[k] += n
}

// Start writes the counts every Options.Every, as nodeID, until Stop.
func (r *Recorder) Start(ctx context.Context, nodeID string) error {
	if err := store.CheckName("node", nodeID, true); err != nil {
		return err
	}
	if r.done != nil {
		return errors.New("rollup: the recorder was started already")
	}
	ctx, r.stop = context.WithCancel(ctx)
	r.nodeID, r.done = nodeID, make(chan struct{})
	go func() {
		defer close(r.done)
		tick := time.NewTicker(r.opts.Every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				r.flush(ctx)
			}
		}
	}()
	return nil
}

// Stop ends the writes and writes what is left, within a few seconds. It
// is safe to call twice, or without Start.
func (r *Recorder) Stop() {
	r.once.Do(func() {
		if r.done == nil {
			return
		}
		r.stop()
		<-r.done
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.flush(ctx)
	})
}

// flush writes the pending counts; on failure they are kept for the next.
func (r *Recorder) flush(ctx context.Context) {
	r.mu.Lock()
	batch := r.pending
	r.pending = map[key]int{}
	r.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	oldest := r.opts.Now().Add(-store.MinuteCountsKept)
	counts := make([]store.MinuteCount, 0, len(batch))
	for k, n := range batch {
		if k.minute.After(oldest) {
			counts = append(counts, store.MinuteCount{Minute: k.minute, Kind: k.kind, Status: k.status, Count: n})
		}
	}
	store.SortMinuteCounts(counts)
	if err := r.store.AddMinuteCounts(ctx, r.nodeID, counts); err != nil {
		r.opts.Logger.Warn("writing the per-minute counts failed; they are kept for the next write",
			zap.String("node", r.nodeID), zap.Int("counts", len(counts)), zap.Error(err))
		r.mu.Lock()
		for k, n := range batch {
			if len(r.pending) < maxPending || r.pending[k] > 0 {
				r.pending[k] += n
			}
		}
		r.mu.Unlock()
	}
}

// Flushed counts the attempts the completer ended, fenced writes aside.
func (r *Recorder) Flushed(done []node.Finished, took time.Duration, err error) {
	for _, f := range done {
		if !f.Fenced {
			r.count(f.Kind, f.To, 1)
		}
	}
	if r.opts.Next != nil {
		r.opts.Next.Flushed(done, took, err)
	}
}

// Rescued counts the attempts reconcile ended: lost, retried, stopped.
func (r *Recorder) Rescued(rep reconcile.Report) {
	if !rep.DryRun {
		for _, e := range rep.Entries {
			switch e.Outcome {
			case reconcile.OutcomeRetried, reconcile.OutcomeLost, reconcile.OutcomeStopped, reconcile.OutcomePaused:
				r.count(e.Kind, e.To, 1)
			}
		}
	}
	if r.opts.Next != nil {
		r.opts.Next.Rescued(rep)
	}
}

// The rest is passed on.

func (r *Recorder) Claimed(started []*task.Task, took time.Duration, err error) {
	if r.opts.Next != nil {
		r.opts.Next.Claimed(started, took, err)
	}
}

func (r *Recorder) TaskLeasesRenewed(renewed, busy, lost int, err error) {
	if r.opts.Next != nil {
		r.opts.Next.TaskLeasesRenewed(renewed, busy, lost, err)
	}
}

func (r *Recorder) BucketLeasesTicked(acquired, lost int, err error) {
	if r.opts.Next != nil {
		r.opts.Next.BucketLeasesTicked(acquired, lost, err)
	}
}

func (r *Recorder) BucketLeasesExpired(lost int) {
	if r.opts.Next != nil {
		r.opts.Next.BucketLeasesExpired(lost)
	}
}

func (r *Recorder) CommandApplied(kind string, latency time.Duration) {
	if r.opts.Next != nil {
		r.opts.Next.CommandApplied(kind, latency)
	}
}

func (r *Recorder) ScheduleAdvanced(fired bool, lag time.Duration, missed int) {
	if r.opts.Next != nil {
		r.opts.Next.ScheduleAdvanced(fired, lag, missed)
	}
}

func (r *Recorder) Pruned(bucket int, res store.PruneResult, err error) {
	if r.opts.Next != nil {
		r.opts.Next.Pruned(bucket, res, err)
	}
}

// LimitsRefreshed passes the node's limit use on to Next, when it follows
// limits.
func (r *Recorder) LimitsRefreshed(uses []node.LimitUse) {
	if lm, ok := r.opts.Next.(node.LimitMetrics); ok {
		lm.LimitsRefreshed(uses)
	}
}

// ServeHTTP serves Next's /metrics, when Next serves HTTP; nothing
// otherwise.
func (r *Recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if h, ok := r.opts.Next.(http.Handler); ok {
		h.ServeHTTP(w, req)
		return
	}
	http.NotFound(w, req)
}
