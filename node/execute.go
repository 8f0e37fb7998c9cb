package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Executor runs attempts. Execute must call run exactly once; it may do so
// in its own goroutine or before it returns. The node accounts for
// concurrency, cancellation and outcomes itself, so an executor only decides
// where the handler's code runs.
type Executor interface {
	Execute(run func())
}

// GoroutineExecutor runs each attempt in a goroutine of its own: the
// default.
type GoroutineExecutor struct{}

func (GoroutineExecutor) Execute(run func()) { go run() }

// InlineExecutor runs each attempt in the goroutine that claimed it (the
// claim loop, or the completer when it claims along with an outcome write),
// before the next task of the batch starts: one handler at a time, in claim
// order. It is meant for tests and for debugging a handler.
type InlineExecutor struct{}

func (InlineExecutor) Execute(run func()) { run() }

// errAttemptOver releases an attempt's context once its handler returned.
var errAttemptOver = errors.New("attempt over")

// errEarlierAttemptRunning gives up an attempt claimed while the handler of
// an earlier attempt of the same task still runs on this node.
var errEarlierAttemptRunning = errors.New("an earlier attempt of the task still runs on this node")

// prepare registers the attempt of a claimed task, which from then on
// counts against the node's slots (see capacity), ready for execute; sent is
// the moment on the node's clock before the claim was sent: the database
// started the task lease no earlier. A claimer prepares its tasks before it
// lets another claimer count the slots, and executes them after.
//
// The attempt's context derives from its bucket lease's context under the
// epoch it was claimed in, so a bucket lost at any moment, before this line
// or after, cancels it; an attempt whose bucket is not held under that epoch
// any more is abandoned before its handler starts.
func (n *Node) prepare(t *task.Task, sent time.Time) *attempt {
	h := n.handlers[t.Kind] // immutable after Start
	a := &attempt{
		view: t, handler: h, ref: t.Ref(), bucket: t.Bucket, epoch: t.Epoch,
		number: t.Attempt, max: t.MaxAttempts, kind: t.Kind, started: t.StartedAt,
	}
	epoch, leaseCtx, held := n.keeper.lease(a.bucket)
	if !held || epoch != a.epoch {
		leaseCtx = n.runCtx // only for the shape: the attempt is abandoned below
	}
	a.ctx, a.cancel = context.WithCancelCause(leaseCtx)
	t.BindAttempt(&attemptHooks{n: n, a: a})
	n.attempts.add(a)

	switch {
	case h == nil:
		// The claim asks only for registered kinds; a store that answered
		// with another is wrong, and the task is left to be rescued.
		a.abandon(fmt.Errorf("kind %q is not registered on this node", t.Kind))
	case !held || epoch != a.epoch:
		a.abandon(ErrBucketLost)
	case n.attempts.othersRunning(a):
		// An earlier attempt's handler, given up but not returned (it
		// ignores its cancellation), still runs here: this one must not
		// run beside it. Nothing is written; its lease lapses, and the
		// rescue, which waits for that handler, tries the task again.
		a.abandon(errEarlierAttemptRunning)
	default:
		// The lease's context ends with the bucket: the attempt is then
		// given up without a write, as its writes would be fenced.
		a.mu.Lock()
		a.stopBucketWatch = context.AfterFunc(leaseCtx, func() {
			if a.abandon(ErrBucketLost) {
				n.log.Warn("cancelling handler: bucket lease lost", a.fields()...)
			}
		})
		a.mu.Unlock()
		if n.isDraining() {
			a.cancel(ErrShuttingDown)
		}
	}
	n.renewer.track(a, sent)

	if t.Timeout > 0 {
		a.timeout = n.cfg.Clock.AfterFunc(t.Timeout, func() { a.cancel(ErrTimeout) })
	}
	// Checked first: the fields of a line that is not written would cost
	// an allocation per task on the hot path.
	if ce := n.log.Check(zap.DebugLevel, "task started"); ce != nil {
		ce.Write(append(a.fields(), zap.String("kind", t.Kind))...)
	}
	return a
}

// execute runs a prepared attempt on the node's executor.
func (n *Node) execute(a *attempt) {
	n.cfg.Executor.Execute(func() { n.runAttempt(a) })
}

// runAttempt runs the handler, unless the attempt was cancelled before it
// started, and settles the attempt.
func (n *Node) runAttempt(a *attempt) {
	var err error
	if cause := context.Cause(a.ctx); cause != nil {
		err = cause
	} else if why := n.startable(a); why != nil {
		a.abandon(why)
		err = why
	} else {
		err = callHandler(a)
	}
	n.finish(a, err)
}

// startable checks, as the handler is about to start, that the attempt's
// bucket lease and task lease are still within their local deadlines. The
// timers that enforce the deadlines run in goroutines of their own: after a
// long pause of the process (SIGSTOP, a stalled machine) a handler's
// goroutine may be scheduled before them, and must not start work the
// fleet may already have given to another node.
func (n *Node) startable(a *attempt) error {
	if epoch, _, held := n.keeper.lease(a.bucket); !held || epoch != a.epoch {
		return ErrBucketLost
	}
	if !n.cfg.Clock.Now().Before(a.taskLeaseDeadline()) {
		return ErrTaskLeaseLost
	}
	return nil
}

// callHandler runs the handler: the registered one wrapped in
// Config.Middleware and in Recover (see Register), so a panic is a failed
// attempt whose error holds the panic value and the stack.
func callHandler(a *attempt) error {
	return a.handler(a.ctx, a.view)
}

// finish settles an attempt whose handler has returned: an abandoned one is
// dropped without a write, any other has its outcome queued for the store.
func (n *Node) finish(a *attempt, err error) {
	a.stopTimers()
	cause := context.Cause(a.ctx)
	a.mu.Lock()
	if a.abandoned == nil && errors.Is(cause, ErrBucketLost) {
		// The bucket's context ended and its watch has not run yet.
		a.abandoned = ErrBucketLost
	}
	a.done = true // abandon leaves it alone from here on: its outcome stands
	abandoned := a.abandoned
	a.mu.Unlock()
	a.cancel(errAttemptOver)

	if abandoned != nil {
		// Logged before it is counted out: once no handler is counted,
		// Shutdown may return, and its caller may close the logger's sink.
		n.log.Warn("abandoned: "+abandonReason(abandoned), append(a.fields(), zap.NamedError("handler_error", err))...)
		// Nothing more is written for it (a stop past its grace wrote its
		// outcome already): what it held is free now that it returned.
		n.releaseLimits(a, true, true)
		n.attempts.returned(a, true)
		n.claimLoop.poke()
		// A rescue of the task may have waited for this handler.
		n.rescuer.loop.poke()
		return
	}
	n.completer.add(a, n.decide(a, err, cause))
	// Counted as returned only once its outcome is queued, so that a
	// shutdown that sees no handler running finds every outcome queued.
	n.attempts.returned(a, false)
}

// abandonReason is the log message of an abandoned attempt.
func abandonReason(why error) string {
	switch {
	case errors.Is(why, ErrBucketLost):
		return "bucket lease lost"
	case errors.Is(why, ErrTaskLeaseLost):
		return "task lease not renewed"
	default:
		return why.Error()
	}
}

// validResult reports whether a handler's result can be stored: valid JSON
// with no NUL character, which PostgreSQL's jsonb refuses. A result that
// cannot be stored fails the attempt instead of failing, again and again,
// the write of every outcome batched with it.
func validResult(r json.RawMessage) bool {
	return len(r) == 0 || json.Valid(r) && !hasNULEscape(r)
}

// hasNULEscape reports whether JSON text holds the escape \u0000: a
// backslash that is not itself escaped, followed by u0000.
func hasNULEscape(r []byte) bool {
	for i := 0; i < len(r); i++ {
		if r[i] != '\\' {
			continue
		}
		if i+5 < len(r) && string(r[i+1:i+6]) == "u0000" {
			return true
		}
		i++ // the escaped character, a backslash included
	}
	return false
}

// attemptHooks connect a handler's task.Task to its attempt on this node.
type attemptHooks struct {
	n *Node
	a *attempt
}

func (h *attemptHooks) Checkpoint(context.Context) error {
	if h.a.pauseRequested.Load() {
		return task.ErrPaused
	}
	return nil
}

func (h *attemptHooks) SaveProgress(ctx context.Context, progress json.RawMessage) error {
	n, a := h.n, h.a
	err := n.store.SaveProgress(ctx, n.incarnation, a.ref, progress)
	if errors.Is(err, store.ErrFenced) {
		n.log.Warn("fenced: progress of a superseded attempt was not saved", a.fields()...)
	}
	return err
}
