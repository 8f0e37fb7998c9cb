package node

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// renewer keeps the task leases of the node's attempts (DESIGN §6).
//
// Every attempt has a local deadline, like a bucket lease: the moment on
// this process's clock, anchored before the claim or the last renewal that
// extended it was sent, after which the database may hold the lease expired
// and a rescue may move the task on. A timer of the attempt's own enforces
// it: past the deadline the handler's context is cancelled (cause
// ErrTaskLeaseLost) and the attempt is dropped without a write. The renewal
// loop only pushes deadlines forward; nothing depends on it running.
//
// Each pass extends, in one statement, the lease of every attempt this node
// has not given up: those still running and those whose outcome waits to be
// written. An attempt the store answers neither renewed nor busy is no
// longer this node's to finish (its bucket's epoch moved on, or it was
// rescued): its handler is cancelled and nothing is written for it. An
// attempt whose row another transaction holds locked is busy: its deadline
// stays where it was, and it is asked for again next period, so that one
// locked row never keeps the other leases from being renewed.
type renewer struct {
	store       store.Store
	owner       string
	attempts    *attempts
	clock       clock.Clock
	ttl         time.Duration
	margin      time.Duration
	stmtTimeout time.Duration
	log         *zap.Logger
	loop        *loop
	metrics     Metrics
}

// taskLeaseMargin is the safety margin between an attempt's local deadline
// and its task lease's expiry in the database: that of bucket leases, but
// never more than a quarter of the TTL, so that a renewal every TTL/3 always
// comes before the deadline it pushes.
func taskLeaseMargin(ttl time.Duration) time.Duration {
	return min(deadlineMargin(ttl), ttl/4)
}

// run renews every TaskLeaseTTL/3 until the loop stops.
func (r *renewer) run(ctx context.Context) {
	every(ctx, r.clock, r.ttl/3, r.loop.wake, false, r.pass)
}

// track arms an attempt's local deadline, counted from sent, the moment
// before its claim was sent.
func (r *renewer) track(a *attempt, sent time.Time) {
	r.extend(a, sent)
}

// extend moves an attempt's local deadline to sent + TTL - margin.
func (r *renewer) extend(a *attempt, sent time.Time) {
	d := sent.Add(r.ttl - r.margin).Sub(r.clock.Now())
	a.armLease(r.clock, d, func() {
		if a.abandon(ErrTaskLeaseLost) {
			r.log.Warn("task lease deadline passed without a renewal: cancelling handler; "+
				"nothing will be written for the attempt", a.fields()...)
		}
	})
}

// pass renews the leases of every attempt not given up.
func (r *renewer) pass(ctx context.Context) {
	all := r.attempts.all()
	refs := make([]task.Ref, 0, len(all))
	byRef := make(map[task.Ref]*attempt, len(all))
	for _, a := range all {
		if _, abandoned := a.state(); abandoned == nil {
			refs = append(refs, a.ref)
			byRef[a.ref] = a
		}
	}
	if len(refs) == 0 {
		return
	}

	// Anchor the new deadlines before the statement is sent: the database
	// may start the TTL any time after this.
	sent := r.clock.Now()
	rctx, cancel := context.WithTimeout(ctx, r.stmtTimeout)
	renewal, err := r.store.RenewTaskLeases(rctx, r.owner, refs, r.ttl)
	cancel()
	if err != nil {
		r.reportTo().TaskLeasesRenewed(0, 0, 0, err)
		// Nothing changes: each attempt keeps the deadline it had, and is
		// given up when it passes.
		r.log.Warn("renewing task leases failed; will retry", zap.Int("tasks", len(refs)), zap.Error(err))
		return
	}
	for _, ref := range renewal.Renewed {
		if a := byRef[ref]; a != nil {
			r.extend(a, sent)
			delete(byRef, ref)
		}
	}
	for _, ref := range renewal.Busy {
		delete(byRef, ref)
	}
	if len(renewal.Busy) > 0 {
		ids := make([]int64, len(renewal.Busy))
		for i, ref := range renewal.Busy {
			ids[i] = ref.ID
		}
		r.log.Warn("task leases not renewed this period: their rows are locked by another transaction; "+
			"will retry", zap.Int64s("tasks", ids))
	}
	r.reportTo().TaskLeasesRenewed(len(renewal.Renewed), len(renewal.Busy), running(byRef), nil)
	for _, a := range byRef {
		// An attempt settled meanwhile may be missing because its outcome
		// was written; abandon leaves it alone.
		if a.abandon(ErrTaskLeaseLost) {
			r.log.Warn("cancelling handler: task lease lost (the task was rescued, or its bucket's epoch "+
				"moved on)", a.fields()...)
		}
	}
}
