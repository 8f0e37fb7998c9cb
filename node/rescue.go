package node

import (
	"context"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/reconcile"
	"github.com/flotilla-dev/flotilla/task"
)

// rescuer is the node's reconcile loop: it rescues the expired tasks of the
// buckets the node holds (invariants 3 and 9), those whose task lease ran
// out by the database clock, and those claimed under an older epoch of
// their bucket, which is how a dead holder's running tasks look right after
// a takeover.
type rescuer struct {
	n    *Node
	loop *loop
	// passes counts finished passes; tests wait on it to know that a pass
	// has looked.
	passes atomic.Int64
}

func newRescuer(n *Node) *rescuer {
	return &rescuer{n: n, loop: newLoop("reconcile")}
}

// run passes when buckets are acquired (so that a takeover does not wait
// out the dead holder's task leases) and every ReconcileInterval. It needs
// no pass of its own at start: Start's first lease tick acquires whatever
// the node holds, and so pokes it.
func (r *rescuer) run(ctx context.Context) {
	every(ctx, r.n.cfg.Clock, r.n.cfg.ReconcileInterval, r.loop.wake, false, r.pass)
}

// pass rescues what is expired in the buckets held now. Retried tasks go
// back through the claim path, which serves them to this node too.
func (r *rescuer) pass(ctx context.Context) {
	defer r.passes.Add(1)
	n := r.n
	held := n.keeper.Held()
	if len(held) == 0 {
		return
	}
	rep, err := reconcile.Rescue(ctx, n.store, reconcile.Request{
		Owner:            n.incarnation,
		Node:             n.id,
		Buckets:          held,
		Backoff:          n.backoff,
		StatementTimeout: n.stmtTimeout,
		InUse:            n.stillRunsHere,
	})
	n.metrics.Rescued(rep)
	for _, e := range rep.Entries {
		n.logRescue(e)
	}
	if len(rep.Entries) > 0 {
		n.log.Info("reconcile pass",
			zap.Int("rescued", rep.Rescued()), zap.Int("retried", rep.Retried), zap.Int("lost", rep.Lost),
			zap.Int("stopped", rep.Stopped), zap.Int("paused", rep.Paused), zap.Int("conflicts", rep.Conflicts),
			zap.Int("fenced", rep.Fenced), zap.Int("refused", rep.Refused), zap.Int("busy", rep.Busy),
			zap.Int("in_use", rep.InUse), zap.Int("failed", rep.Failed))
	}
	if rep.Retried > 0 {
		// A retry due at once is claimable now; a later one is found by
		// the claim loop's poll once its backoff has passed.
		n.claimLoop.poke()
	}
	if rep.Rescued() > 0 && n.limits.active() {
		// The rows rescued ran under a previous holder, and the limits
		// count them until a refresh reads that they no longer run: read
		// it now, not a heartbeat later (the refresh pokes the claim loop).
		n.limitLoop.poke()
	}
	if err != nil && ctx.Err() == nil {
		// What is left is still expired: the next pass finds it again.
		n.log.Warn("rescuing expired tasks failed; will retry", zap.Error(err))
	}
}

// stillRunsHere reports whether a handler of t still runs on this node, and
// cancels it: the task's lease expired in the database, so whatever the
// handler does now is fenced, and the task must not be rescued, claimed and
// run again here while it runs. The rescue waits for a later pass; the
// handler's return pokes one.
func (n *Node) stillRunsHere(t *task.Task) bool {
	running := false
	for _, a := range n.attempts.ofTask(t.ID) {
		if done, _ := a.state(); done {
			continue
		}
		running = true
		if a.abandon(ErrTaskLeaseLost) {
			n.log.Warn("cancelling handler: its task lease expired in the database and the task is "+
				"being rescued", a.fields()...)
		}
	}
	return running
}

// logRescue logs what became of one expired task.
func (n *Node) logRescue(e reconcile.Entry) {
	fields := []zap.Field{
		zap.Int("bucket", e.Bucket), zap.Int64("epoch", e.Epoch), zap.Int64("task", e.TaskID),
		zap.String("kind", e.Kind), zap.String("from", string(e.From)), zap.String("to", string(e.To)),
		zap.String("previous_owner", e.PreviousOwner), zap.Int64("previous_epoch", e.PreviousEpoch),
		zap.Int("attempt", e.Attempt), zap.String("reason", e.Reason),
	}
	switch e.Outcome {
	case reconcile.OutcomeRetried:
		n.log.Info("rescued a lost attempt; retrying", append(fields, zap.Duration("delay", e.Delay))...)
	case reconcile.OutcomeLost:
		n.log.Info("rescued a lost attempt; no attempt left, the task is lost", fields...)
	case reconcile.OutcomeStopped:
		n.log.Info("rescued a lost attempt; a stop was pending, the task is stopped", fields...)
	case reconcile.OutcomePaused:
		n.log.Info("rescued a lost attempt; a pause was pending, the task is paused", fields...)
	case reconcile.OutcomeInUse:
		n.log.Info("rescue postponed: the task's handler still runs on this node; it was cancelled", fields...)
	case reconcile.OutcomeBusy:
		n.log.Warn("rescue postponed: the task's row is locked by another transaction",
			append(fields, zap.String("error", e.Err))...)
	case reconcile.OutcomeFailed:
		n.log.Warn("rescue of the task failed; will retry", append(fields, zap.String("error", e.Err))...)
	case reconcile.OutcomeFenced:
		n.log.Warn("rescue fenced: this node no longer holds the task's bucket under this epoch; "+
			"its new holder rescues it", append(fields, zap.String("error", e.Err))...)
	case reconcile.OutcomeConflict:
		n.log.Warn("rescue skipped: the task moved since it was found expired (a late outcome landed first)",
			append(fields, zap.String("error", e.Err))...)
	default:
		n.log.Error("rescue refused by the store", append(fields, zap.String("error", e.Err))...)
	}
}
