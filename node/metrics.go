package node

import (
	"time"

	"github.com/flotilla-dev/flotilla/reconcile"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Metrics receives the facts a node learns as it works, at the points that
// already know them: a claim pass knows what it started and how long its
// statement took, the completer what it wrote, the keeper what it acquired
// and lost. Nothing is counted in the database for it, so an implementation
// (package metrics exports them to Prometheus) costs the fleet no query.
//
// Methods are called from the node's loops and must not block.
type Metrics interface {
	// Claimed: one claim statement started tasks (none on err).
	Claimed(started []*task.Task, took time.Duration, err error)
	// Flushed: one completer batch was written; done is empty on err.
	Flushed(done []Finished, took time.Duration, err error)
	// TaskLeasesRenewed: one renewal pass of task leases.
	TaskLeasesRenewed(renewed, busy, lost int, err error)
	// BucketLeasesTicked: one renewal of the bucket leases: acquired
	// counts leases taken (or taken again under a new epoch), lost those
	// that another node holds now.
	BucketLeasesTicked(acquired, lost int, err error)
	// BucketLeasesExpired: leases whose local deadline passed without a
	// renewal.
	BucketLeasesExpired(lost int)
	// Rescued: one reconcile pass over the held buckets.
	Rescued(rep reconcile.Report)
	// CommandApplied: a stop or pause reached its task's handler, latency
	// after it was issued.
	CommandApplied(kind string, latency time.Duration)
	// ScheduleAdvanced: a due schedule was advanced; lag is how late its
	// tick fired (by the database clock, zero when nothing fired), missed
	// how many ticks were skipped.
	ScheduleAdvanced(fired bool, lag time.Duration, missed int)
	// Pruned: one retention batch in a held bucket removed res (nothing
	// on err).
	Pruned(bucket int, res store.PruneResult, err error)
}

// Finished is one outcome the completer wrote.
type Finished struct {
	Kind string
	From task.Status // running, or stopping or pausing when a command reached it
	To   task.Status // the state the store put the task in
	// Ran is the attempt's run time, from its start in the database to
	// the handler's return on this node.
	Ran time.Duration
	// Fenced is set when the write was refused because the attempt was
	// superseded; To is then meaningless.
	Fenced bool
}

// nopMetrics is the default: a node without Config.Metrics counts nothing.
type nopMetrics struct{}

func (nopMetrics) Claimed([]*task.Task, time.Duration, error) {}
func (nopMetrics) Flushed([]Finished, time.Duration, error)   {}
func (nopMetrics) TaskLeasesRenewed(int, int, int, error)     {}
func (nopMetrics) BucketLeasesTicked(int, int, error)         {}
func (nopMetrics) BucketLeasesExpired(int)                    {}
func (nopMetrics) Rescued(reconcile.Report)                   {}
func (nopMetrics) CommandApplied(string, time.Duration)       {}
func (nopMetrics) ScheduleAdvanced(bool, time.Duration, int)  {}
func (nopMetrics) Pruned(int, store.PruneResult, error)       {}

// finished describes a written batch for Metrics.Flushed. The run time is
// measured from the task's start as the database recorded it at the claim
// to now on this node's clock: the two clocks agree closely enough for a
// histogram whose smallest bucket is milliseconds.
func (n *Node) finished(batch []completion, outcomes []store.Outcome) []Finished {
	now := n.cfg.Clock.Now()
	out := make([]Finished, 0, len(batch))
	for i, cp := range batch {
		if i >= len(outcomes) {
			break
		}
		f := Finished{Kind: cp.a.kind, From: task.Running, To: outcomes[i].Status, Fenced: outcomes[i].Err != nil}
		cp.a.mu.Lock()
		if cp.a.stopCommand != 0 {
			f.From = task.Stopping
		}
		cp.a.mu.Unlock()
		if f.From == task.Running && cp.a.pauseRequested.Load() {
			f.From = task.Pausing
		}
		if !cp.a.started.IsZero() {
			f.Ran = now.Sub(cp.a.started)
		}
		out = append(out, f)
	}
	return out
}

// ActiveByKind counts the attempts this node runs now, by kind: handlers
// running, and those whose outcome waits to be written. Every kind the node
// serves is present, with 0 when none runs.
func (n *Node) ActiveByKind() map[string]int {
	out := map[string]int{}
	n.mu.Lock()
	for _, k := range n.kinds {
		out[k] = 0
	}
	n.mu.Unlock()
	for _, a := range n.attempts.all() {
		if _, abandoned := a.state(); abandoned == nil {
			out[a.kind]++
		}
	}
	return out
}

// Standby counts the declared buckets that live nodes hold while this one
// waits for them.
func (n *Node) Standby() int {
	n.mu.Lock()
	k := n.keeper
	n.mu.Unlock()
	if k == nil {
		return 0
	}
	_, standby, _ := k.status()
	return standby
}

// firingLag is how late a schedule's tick fired, by the database clock:
// zero when the request fired nothing.
func firingLag(now time.Time, req store.FireRequest, res store.FireResult) time.Duration {
	if !res.Fired || req.ScheduledFor.IsZero() {
		return 0
	}
	return max(now.Sub(req.ScheduledFor), 0)
}

// reportTo is the keeper's Metrics; a keeper built without one reports to
// none.
func (k *leaseKeeper) reportTo() Metrics {
	if k.metrics == nil {
		return nopMetrics{}
	}
	return k.metrics
}

// reportTo is the renewer's Metrics; a renewer built without one reports
// to none.
func (r *renewer) reportTo() Metrics {
	if r.metrics == nil {
		return nopMetrics{}
	}
	return r.metrics
}

// running counts the attempts whose handler has not returned: of those a
// renewal did not renew, the ones whose lease is lost. An attempt whose
// outcome was written meanwhile is missing from the answer too, but it
// finished rather than lost its lease.
func running(byRef map[task.Ref]*attempt) int {
	n := 0
	for _, a := range byRef {
		if done, _ := a.state(); !done {
			n++
		}
	}
	return n
}
