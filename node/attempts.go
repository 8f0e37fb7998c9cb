package node

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/task"
)

// attempt is one claimed attempt of a task on this node.
//
// Its context derives from the context of its bucket's lease under the epoch
// it was claimed in (leaseKeeper.lease), so a lost bucket cancels it with no
// scan of the attempts; its own task-lease deadline, its timeout, a stop
// and a shutdown cancel it too, each with its cause.
type attempt struct {
	// view is the handler's copy of the task; the fields below are the
	// node's own, so a handler that changes view cannot confuse the node.
	view    *task.Task
	handler Handler
	ref     task.Ref
	bucket  int
	epoch   int64
	number  int // attempt number, counting this one
	kind    string
	started time.Time // the attempt's start, by the database clock
	max     int       // max attempts
	timeout clock.Timer

	ctx    context.Context
	cancel context.CancelCauseFunc

	// pauseRequested makes the handler's checkpoint answer task.ErrPaused.
	pauseRequested atomic.Bool

	mu sync.Mutex
	// done is set once the handler has returned.
	done bool
	// settled is set once the attempt's outcome is written or given up,
	// and released once what it held in the limiter was freed: when both
	// done and settled hold, whichever comes last (releaseLimits).
	settled, released bool
	// abandoned says why the attempt was given up without a write: its
	// bucket or task lease was lost. Its handler may still be running.
	abandoned error
	// stopCommand is the stop command applied to the attempt (0: none);
	// stopGrace abandons the handler if it has not returned in time.
	stopCommand int64
	stopGrace   clock.Timer
	// stopNoted is set when a stop's notification cancelled the handler,
	// before the command was read: the stop's delivery is timed then, once.
	// notedStop is that stop's "by ISSUER: REASON", for the trail when the
	// handler's outcome is written before the command is read.
	stopNoted bool
	notedStop string
	// leaseTimer fires at the task lease's local deadline: the moment,
	// on this process's clock, after which the database may consider the
	// lease expired and a rescue may move the task on.
	leaseTimer clock.Timer
	// leaseDeadline is that moment, for a check that cannot wait for the
	// timer's goroutine (see Node.startable).
	leaseDeadline time.Time
	// stopBucketWatch ends the watch on the bucket's context.
	stopBucketWatch func() bool
	// appended are the pipeline steps the handler appended (task.Append),
	// written with the attempt's outcome.
	appended []task.Step
	// depResults are the dependencies' results, read at the handler's
	// first call for them (nil until then).
	depResults map[string]json.RawMessage
}

func (a *attempt) fields() []zap.Field {
	return []zap.Field{
		zap.Int64("task", a.ref.ID), zap.Int64("claim_seq", a.ref.ClaimSeq),
		zap.Int("bucket", a.bucket), zap.Int64("epoch", a.epoch), zap.Int("attempt", a.number),
	}
}

// abandon gives the attempt up: its handler is cancelled with why, and
// nothing will be written for it, since the store would fence the write. It
// reports whether this call abandoned it; an attempt whose handler has
// returned, or that was abandoned before, is left alone.
func (a *attempt) abandon(why error) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done || a.abandoned != nil {
		return false
	}
	a.abandoned = why
	a.cancel(why)
	return true
}

// over records one end of the attempt (its handler returned; its outcome
// written or given up) and reports whether what it holds in the limiter
// must be freed now: both ends have come, and it was not freed before.
// Whatever the order of the ends, it reports true once.
func (a *attempt) over(returned, settled bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.done = a.done || returned
	a.settled = a.settled || settled
	if !a.done || !a.settled || a.released {
		return false
	}
	a.released = true
	return true
}

// state reads the attempt's settled flags.
func (a *attempt) state() (done bool, abandoned error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.done, a.abandoned
}

// armLease sets the task lease's local deadline to d from now on clk; past
// it, expired is called. The previous deadline, if any, is dropped.
func (a *attempt) armLease(clk clock.Clock, d time.Duration, expired func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done {
		return
	}
	if a.leaseTimer != nil {
		a.leaseTimer.Stop()
	}
	a.leaseDeadline = clk.Now().Add(d)
	a.leaseTimer = clk.AfterFunc(d, expired)
}

// taskLeaseDeadline returns the task lease's local deadline.
func (a *attempt) taskLeaseDeadline() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leaseDeadline
}

// stopTimers ends the attempt's timers once its handler has returned.
func (a *attempt) stopTimers() {
	if a.timeout != nil {
		a.timeout.Stop()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.leaseTimer != nil {
		a.leaseTimer.Stop()
	}
	if a.stopGrace != nil {
		a.stopGrace.Stop()
	}
	if a.stopBucketWatch != nil {
		a.stopBucketWatch()
	}
}

// attempts is the registry of the attempts a node has claimed and not yet
// settled: their handler is running, or their outcome is waiting to be
// written. It is keyed by task.Ref (task id and claim_seq), so that two
// attempts of one task, a running one and an abandoned one whose handler
// has not returned yet, never overwrite each other. With the count of
// handlers that have not returned, it bounds the claims (Node.capacity).
type attempts struct {
	mu     sync.Mutex
	byRef  map[task.Ref]*attempt
	byTask map[int64][]*attempt
	// active counts handlers that have not returned.
	active int
	// changed is closed and replaced whenever the registry changes, so
	// that Shutdown can wait without polling.
	changed chan struct{}
}

func newAttempts() *attempts {
	return &attempts{byRef: map[task.Ref]*attempt{}, byTask: map[int64][]*attempt{}, changed: make(chan struct{})}
}

// add registers a claimed attempt whose handler is about to run.
func (r *attempts) add(a *attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byRef[a.ref] = a
	r.byTask[a.ref.ID] = append(r.byTask[a.ref.ID], a)
	r.active++
	r.broadcastLocked()
}

// removeLocked takes a out of the registry, if it is there. r.mu must be
// held.
func (r *attempts) removeLocked(a *attempt) {
	if r.byRef[a.ref] != a {
		return
	}
	delete(r.byRef, a.ref)
	same := r.byTask[a.ref.ID]
	for i, other := range same {
		if other == a {
			same = append(same[:i], same[i+1:]...)
			break
		}
	}
	if len(same) == 0 {
		delete(r.byTask, a.ref.ID)
	} else {
		r.byTask[a.ref.ID] = same
	}
}

// returned counts a handler out; with settled, the attempt leaves the
// registry too (it was abandoned: nothing is written for it).
func (r *attempts) returned(a *attempt, settled bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active--
	if settled {
		r.removeLocked(a)
	}
	r.broadcastLocked()
}

// settle removes attempts whose outcome has been written (or given up).
func (r *attempts) settle(as []*attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range as {
		r.removeLocked(a)
	}
	r.broadcastLocked()
}

func (r *attempts) broadcastLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// counts returns the number of attempts registered and of handlers running,
// and a channel closed at the next change.
func (r *attempts) counts() (registered, active int, changed <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byRef), r.active, r.changed
}

// all returns the registered attempts, in no order.
func (r *attempts) all() []*attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*attempt, 0, len(r.byRef))
	for _, a := range r.byRef {
		out = append(out, a)
	}
	return out
}

// ofTask returns every registered attempt of task id.
func (r *attempts) ofTask(id int64) []*attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*attempt(nil), r.byTask[id]...)
}

// othersRunning reports whether a handler of another attempt of a's task
// has not returned yet.
func (r *attempts) othersRunning(a *attempt) bool {
	for _, other := range r.ofTask(a.ref.ID) {
		if other == a {
			continue
		}
		if done, _ := other.state(); !done {
			return true
		}
	}
	return false
}

// current returns the attempt of task id that this node still means to
// finish: not abandoned, the latest claim among them. A command applies to
// it, never to an abandoned attempt whose handler has yet to return.
func (r *attempts) current(id int64) *attempt {
	var best *attempt
	for _, a := range r.ofTask(id) {
		if _, abandoned := a.state(); abandoned != nil {
			continue
		}
		if best == nil || a.ref.ClaimSeq > best.ref.ClaimSeq {
			best = a
		}
	}
	return best
}

// has reports whether an attempt of ref is registered.
func (r *attempts) has(ref task.Ref) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.byRef[ref]
	return ok
}

// inBucket counts the attempts of bucket b registered (a handler running,
// or an outcome waiting to be written), with a channel closed at the next
// change.
func (r *attempts) inBucket(b int) (int, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.byRef {
		if a.bucket == b {
			n++
		}
	}
	return n, r.changed
}

// cancelBucket cancels, with cause, the handlers of bucket b that have not
// returned and were not given up, and returns their attempts.
func (r *attempts) cancelBucket(b int, cause error) []*attempt {
	var out []*attempt
	for _, a := range r.all() {
		if a.bucket != b {
			continue
		}
		if done, abandoned := a.state(); !done && abandoned == nil {
			a.cancel(cause)
			out = append(out, a)
		}
	}
	return out
}
