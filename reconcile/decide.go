package reconcile

import (
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// move is what the rescue of one task asks the store for.
type move struct {
	to      task.Status
	delay   time.Duration
	reason  string
	errText string
}

// decide plans the rescue of expired task t in a bucket the caller holds
// under epoch. It asks for retrying or lost only: a task that is stopping
// or has a stop pending is sent to stopped by the store itself, which sees
// the pending stop in the same transaction as the move, where a check made
// here could already be stale.
func decide(t *task.Task, epoch int64, backoff func(attempt int) time.Duration) move {
	m := move{reason: cause(t, epoch)}
	if t.Attempt < t.MaxAttempts {
		m.to = task.Retrying
		if backoff != nil {
			m.delay = max(backoff(t.Attempt), 0)
		}
		m.errText = fmt.Sprintf("attempt %d of %d was lost: %s", t.Attempt, t.MaxAttempts, m.reason)
	} else {
		m.to = task.Lost
		m.errText = fmt.Sprintf("attempt %d, the last of %d, was lost: %s", t.Attempt, t.MaxAttempts, m.reason)
	}
	return m
}

// cause says why t counts as expired, naming the owner whose attempt was
// lost, as the audit event must (DESIGN §4). An older epoch is named first
// even when the lease has expired too: the takeover is what fenced the
// attempt, whatever its lease said.
func cause(t *task.Task, epoch int64) string {
	owner := t.Owner
	if owner == "" {
		owner = "an unrecorded owner"
	}
	if t.Epoch < epoch {
		return fmt.Sprintf("claimed by %s under epoch %d, bucket now at epoch %d", owner, t.Epoch, epoch)
	}
	return fmt.Sprintf("lease of %s expired", owner)
}
