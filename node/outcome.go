package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// decide maps what a handler did to the write that records it:
//
//   - nil: succeeded, with the handler's result. This holds even when the
//     attempt's context was cancelled meanwhile: the work was done, and the
//     record tells the truth.
//   - cancelled by a stop: stopped.
//   - task.ErrPaused after a pause was requested: paused, with the
//     progress the handler saved.
//   - cancelled for a shutdown, or for the hand-off of its bucket: released
//     to queued; the attempt does not count. A task that was pausing is
//     paused instead.
//   - cancelled by the task's timeout: retrying while attempts remain, else
//     timed_out.
//   - any other error, a panic included: retrying while attempts remain,
//     else failed; failed at once for an error that wraps task.ErrNoRetry.
//
// A result the handler set is kept with every end but a release and a
// pause, success or not (the exec kind keeps its child's output so).
//
// cause is the attempt context's cancellation cause, nil if it was not
// cancelled.
func (n *Node) decide(a *attempt, err, cause error) (tr store.ActiveTransition) {
	// Steps the handler appended go with every outcome: the store writes
	// them only with a move that ends the task.
	tr = store.ActiveTransition{Ref: a.ref, Node: n.id, Append: a.takeAppended()}
	if err == nil {
		if len(a.view.Result) > task.MaxResultBytes {
			err = fmt.Errorf("the handler succeeded but set a result of %d bytes, over the cap of %d (task.MaxResultBytes)",
				len(a.view.Result), task.MaxResultBytes)
		} else if validResult(a.view.Result) {
			tr.To, tr.Reason, tr.Result = task.Succeeded, "handler returned", a.view.Result
			return tr
		} else {
			err = fmt.Errorf("the handler succeeded but set a result that cannot be stored: it is not valid JSON, "+
				"or it holds a NUL character (\\u0000) (%d bytes)", len(a.view.Result))
		}
	}
	retry := a.number < a.max && !errors.Is(err, task.ErrNoRetry)
	defer func() {
		// An attempt that ended without success keeps what its handler
		// recorded of it (the exec kind: the end of the child's output),
		// for the operator who finds it failed. A release or a pause is
		// no end of the attempt's work: its result is not kept.
		if tr.To != task.Queued && tr.To != task.Paused && len(a.view.Result) > 0 &&
			len(a.view.Result) <= task.MaxResultBytes && validResult(a.view.Result) {
			tr.Result = a.view.Result
		}
	}()
	switch {
	case errors.Is(cause, ErrStopRequested):
		// The store would turn any other outcome into stopped as well (a
		// stop wins), but the trail reads better with the real reason.
		tr.To, tr.Reason = task.Stopped, "stopped on request"
		a.mu.Lock()
		if a.stopNoted {
			// Cancelled on the stop's note, perhaps before the command
			// was read: this may be the stop's only event, so it says who
			// asked.
			tr.Reason = "stop requested" + a.notedStop + "; stopped on request"
		}
		a.mu.Unlock()
		if !errors.Is(err, context.Canceled) && !errors.Is(err, ErrStopRequested) {
			tr.Error = err.Error()
		}
	case errors.Is(err, task.ErrPaused) && a.pauseRequested.Load():
		tr.To, tr.Reason = task.Paused, "paused at a checkpoint"
	case released(cause) && a.pauseRequested.Load():
		// A pausing task cannot go back to queued: it was asked to pause,
		// and it is paused, keeping the progress it saved.
		tr.To, tr.Reason = task.Paused, "paused at "+releaseOccasion(cause)+" before reaching a checkpoint"
		if !errors.Is(err, cause) && !errors.Is(err, context.Canceled) {
			tr.Error = err.Error()
		}
	case released(cause):
		tr.To, tr.Reason = task.Queued, "released at "+releaseOccasion(cause)
		if !errors.Is(err, cause) && !errors.Is(err, context.Canceled) {
			tr.Error = err.Error()
		}
	case errors.Is(cause, ErrTimeout):
		tr.Error = fmt.Sprintf("attempt %d timed out after %v: %v", a.number, a.view.Timeout, err)
		if retry {
			tr.To, tr.Reason, tr.Delay = task.Retrying, "timed out; retrying", n.backoff(a.number)
		} else {
			tr.To, tr.Reason = task.TimedOut, fmt.Sprintf("timed out on the last of %d attempts", a.max)
		}
	default:
		tr.Error = err.Error()
		if retry {
			tr.To, tr.Reason, tr.Delay = task.Retrying, "failed; retrying", n.backoff(a.number)
		} else {
			tr.To, tr.Reason = task.Failed, fmt.Sprintf("failed on the last of %d attempts", a.max)
			if a.number < a.max {
				tr.Reason = "failed; not worth retrying"
			}
		}
	}
	return tr
}

// released reports whether a handler cancelled with cause gives its task
// back for another attempt, not counted: at shutdown, or at the hand-off of
// its bucket.
func released(cause error) bool {
	return errors.Is(cause, ErrShuttingDown) || errors.Is(cause, ErrHandingOff)
}

// releaseOccasion names, for a task's trail, why its attempt was given back.
func releaseOccasion(cause error) string {
	if errors.Is(cause, ErrHandingOff) {
		return "the hand-off of its bucket"
	}
	return "shutdown"
}

// backoff is the delay before the attempt after attempt number n.
func (n *Node) backoff(attempt int) time.Duration {
	return backoff(attempt, n.cfg.BackoffBase, n.cfg.BackoffMax, n.jitter)
}

// backoff is exponential backoff with full jitter: a random delay in
// [0, min(ceiling, base × 2^(attempt-1))]. Full jitter spreads the retries of
// tasks that failed together (a dependency that went down), which is what
// keeps them from failing together again. jitter draws from [0, c].
func backoff(attempt int, base, ceiling time.Duration, jitter func(c time.Duration) time.Duration) time.Duration {
	c := base
	for i := 1; i < attempt && c < ceiling; i++ {
		if c > ceiling/2 {
			c = ceiling // doubling would pass the ceiling, or overflow
			break
		}
		c *= 2
	}
	c = min(c, ceiling)
	if c <= 0 {
		return 0
	}
	return min(max(jitter(c), 0), c)
}
