package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// DefaultLimit is how many expired tasks one listing asks for.
const DefaultLimit = 1000

// Request names whose rescue it is and where.
type Request struct {
	// Owner is the caller's incarnation: every move requires it to hold
	// the task's bucket under the epoch named in Buckets.
	Owner string
	// Node is the caller's node id, recorded in the audit events.
	Node string
	// Buckets are the buckets the caller holds now, with their epochs. No
	// task of another bucket is listed or moved.
	Buckets []store.HeldBucket
	// Limit is the page size of one listing (DefaultLimit when zero).
	Limit int
	// Backoff is the delay before the retry of a task whose attempt number
	// attempt was lost. Nil retries at once.
	Backoff func(attempt int) time.Duration
	// StatementTimeout bounds each store call, so that one stuck statement
	// cannot hold the caller's loop; zero leaves it to ctx.
	StatementTimeout time.Duration
	// DryRun lists and decides, but moves nothing.
	DryRun bool
	// InUse, when set, reports whether the caller itself still runs an
	// attempt of the task, and makes it stop: a node that rescued a task
	// its own handler still runs could claim it and run it a second time
	// beside the first. Such a task is left for a later pass
	// (OutcomeInUse), once that handler has returned.
	InUse func(t *task.Task) bool
	// RetryBusyFor, when positive, tries a task answered busy (its row
	// locked by another transaction; on SQLite, the file locked by another
	// process's write) again, after pauses that double from 10 ms up to
	// 500 ms, for as long as the pauses of the whole rescue add up to no
	// more than RetryBusyFor; after that a busy task is left at its first
	// answer. It is for a run with no later pass to leave the task to, as
	// an operator's; the budget is the rescue's, not each task's, so a
	// file locked throughout delays the rescue by about RetryBusyFor, not
	// by that for every task. Zero tries once.
	RetryBusyFor time.Duration
}

func (r Request) validate() error {
	switch {
	case r.Owner == "":
		return fmt.Errorf("%w: reconcile: Owner (the caller's incarnation) is empty", store.ErrInvalid)
	case r.Node == "":
		return fmt.Errorf("%w: reconcile: Node (the caller's node id) is empty", store.ErrInvalid)
	case r.Limit < 0:
		return fmt.Errorf("%w: reconcile: Limit is %d; it must be positive (or zero for %d)",
			store.ErrInvalid, r.Limit, DefaultLimit)
	case r.StatementTimeout < 0:
		return fmt.Errorf("%w: reconcile: StatementTimeout is %v; it must be positive (or zero for none)",
			store.ErrInvalid, r.StatementTimeout)
	case r.RetryBusyFor < 0:
		return fmt.Errorf("%w: reconcile: RetryBusyFor is %v; it must be positive (or zero to try a busy task once)",
			store.ErrInvalid, r.RetryBusyFor)
	}
	seen := map[int]bool{}
	for _, h := range r.Buckets {
		if seen[h.Bucket] {
			return fmt.Errorf("%w: reconcile: bucket %d is named twice", store.ErrInvalid, h.Bucket)
		}
		seen[h.Bucket] = true
	}
	return nil
}

// maxFailuresInARow is how many failed moves in a row end a rescue early.
const maxFailuresInARow = 3

// Rescue moves every expired task of req.Buckets out of its lost attempt:
// to retrying while attempts remain, to lost after that, to stopped when a
// stop is pending. It lists a page of expired tasks at a time until a page
// comes back short, so a backlog of any size is rescued in one call.
//
// A task that moved meanwhile (store.ErrConflict), a bucket the caller no
// longer holds (store.ErrFenced), a row another transaction holds locked
// (not waited for, or for no longer than Request.RetryBusyFor:
// store.ErrBusy) and a move the store failed to make are
// outcomes in the report, one task at a time, not errors: one bad row never
// holds up the rescue of the others. The error is for a store that could not
// list the expired tasks, or a ctx that ended, and comes with the report of
// what was done before it.
func Rescue(ctx context.Context, s store.Store, req Request) (Report, error) {
	rep := Report{DryRun: req.DryRun}
	if err := req.validate(); err != nil {
		return rep, err
	}
	r := &rescuer{
		s: s, req: req, limit: req.Limit,
		epochs: map[int]int64{}, tried: map[int64]int64{}, fenced: map[int]bool{},
	}
	if r.limit == 0 {
		r.limit = DefaultLimit
	}
	held := slices.Clone(req.Buckets)
	for _, h := range held {
		r.epochs[h.Bucket] = h.Epoch
	}

	failedInARow := 0
	for len(held) > 0 {
		tasks, err := r.expired(ctx, held)
		if err != nil {
			return rep, err
		}
		rep.Passes++
		fresh := 0
		for _, t := range tasks {
			if v, ok := r.tried[t.ID]; ok && v == t.StatusVersion {
				continue // refused earlier in this rescue, and unchanged since
			}
			if r.fenced[t.Bucket] {
				continue // its new holder rescues it
			}
			r.tried[t.ID] = t.StatusVersion
			fresh++
			e, err := r.rescue(ctx, t)
			if err != nil {
				return rep, err
			}
			if ctx.Err() != nil {
				return rep, fmt.Errorf("reconcile: %w", context.Cause(ctx))
			}
			if e.Outcome == OutcomeFailed {
				failedInARow++
			} else {
				failedInARow = 0
			}
			rep.add(e)
			if failedInARow >= maxFailuresInARow {
				// The store, not one row, is failing: the next pass tries
				// again rather than spend a timeout on every task.
				return rep, fmt.Errorf("reconcile: %d moves in a row failed, the last of task %d: %s",
					failedInARow, t.ID, e.Err)
			}
			if e.Outcome == OutcomeFenced {
				// Every other move in this bucket would be fenced too.
				r.fenced[t.Bucket] = true
				held = slices.DeleteFunc(held, func(h store.HeldBucket) bool { return h.Bucket == t.Bucket })
			}
		}
		full := len(tasks) >= r.limit
		if req.DryRun {
			// Nothing moved, so the next page would be this one again.
			rep.More = full
			break
		}
		if !full || fresh == 0 {
			// A short page is the last; a full page of tasks already
			// refused would come back the same.
			break
		}
	}
	return rep, nil
}

// rescuer carries one Rescue.
type rescuer struct {
	s      store.Store
	req    Request
	limit  int
	epochs map[int]int64 // bucket -> epoch held
	// tried maps each task handled so far to its status version then, so
	// that a task refused once is not asked about again while unchanged.
	tried map[int64]int64
	// fenced holds the buckets found lost during this rescue.
	fenced map[int]bool
	// stops caches, for a dry run, the tasks with a pending stop by owner.
	stops map[string]map[int64]bool
	// busyPaused adds up the pauses before the tries of busy tasks again,
	// which Request.RetryBusyFor bounds.
	busyPaused time.Duration
}

// call bounds one store call by the request's statement timeout.
func (r *rescuer) call(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.req.StatementTimeout > 0 {
		return context.WithTimeout(ctx, r.req.StatementTimeout)
	}
	return context.WithCancel(ctx)
}

func (r *rescuer) expired(ctx context.Context, held []store.HeldBucket) ([]*task.Task, error) {
	cctx, cancel := r.call(ctx)
	defer cancel()
	tasks, err := r.s.ExpiredTasks(cctx, held, r.limit)
	if err != nil {
		return nil, fmt.Errorf("reconcile: listing expired tasks: %w", err)
	}
	return tasks, nil
}

// rescue moves one expired task, or on a dry run says where it would go.
func (r *rescuer) rescue(ctx context.Context, t *task.Task) (Entry, error) {
	epoch, ok := r.epochs[t.Bucket]
	if !ok {
		// The store answered a task of a bucket it was not asked about.
		// Moving it would be guarded anyway; not asking is simpler to trust.
		return Entry{}, fmt.Errorf("reconcile: the store listed task %d of bucket %d, which was not asked for",
			t.ID, t.Bucket)
	}
	m := decide(t, epoch, r.req.Backoff)
	e := Entry{
		TaskID: t.ID, Bucket: t.Bucket, Kind: t.Kind, From: t.Status,
		PreviousOwner: t.Owner, PreviousEpoch: t.Epoch, Epoch: epoch, Attempt: t.Attempt,
		Reason: m.reason,
	}
	if r.req.InUse != nil && !r.req.DryRun && r.req.InUse(t) {
		e.Outcome, e.To = OutcomeInUse, t.Status
		e.Err = "an attempt of the task still runs on this node: it was cancelled, and the task is rescued once it returns"
		return e, nil
	}
	if r.req.DryRun {
		to, err := r.predict(ctx, t, m.to)
		if err != nil {
			return e, err
		}
		e.To, e.Outcome = to, outcomeOf(m.to, to)
		if e.Outcome == OutcomeRetried {
			e.Delay = m.delay
		}
		return e, nil
	}

	move := store.Transition{
		ID: t.ID, Version: t.StatusVersion, To: m.to, Reason: m.reason, Error: m.errText,
		Node: r.req.Node, Epoch: epoch, Delay: m.delay,
		Guard:  &store.LeaseGuard{Owner: r.req.Owner, Epoch: epoch},
		NoWait: true,
	}
	moved, err := r.transition(ctx, move)
	var refused *task.TransitionError
	switch {
	case err == nil:
		e.To, e.Outcome = moved.Status, outcomeOf(m.to, moved.Status)
		if e.Outcome == OutcomeRetried {
			e.Delay = m.delay
		}
	case errors.Is(err, store.ErrConflict):
		e.Outcome, e.Err, e.To = OutcomeConflict, err.Error(), r.current(ctx, t)
	case errors.Is(err, store.ErrFenced):
		e.Outcome, e.Err, e.To = OutcomeFenced, err.Error(), t.Status
	case errors.Is(err, store.ErrBusy):
		e.Outcome, e.Err, e.To = OutcomeBusy, err.Error(), t.Status
	case errors.As(err, &refused), errors.Is(err, store.ErrNotFound):
		e.Outcome, e.Err, e.To = OutcomeRefused, err.Error(), t.Status
	default:
		e.Outcome, e.Err, e.To = OutcomeFailed, err.Error(), t.Status
	}
	return e, nil
}

// Pauses between the tries of a busy task (Request.RetryBusyFor).
const (
	firstBusyPause = 10 * time.Millisecond
	maxBusyPause   = 500 * time.Millisecond
)

// transition makes one move, trying it again while the store answers busy
// and the rescue's budget of pauses lasts (Request.RetryBusyFor).
func (r *rescuer) transition(ctx context.Context, move store.Transition) (*task.Task, error) {
	pause := firstBusyPause
	for {
		cctx, cancel := r.call(ctx)
		moved, err := r.s.Transition(cctx, move)
		cancel()
		if !errors.Is(err, store.ErrBusy) || r.busyPaused+pause > r.req.RetryBusyFor {
			return moved, err
		}
		wait := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			wait.Stop()
			return moved, err
		case <-wait.C:
		}
		r.busyPaused += pause
		pause = min(2*pause, maxBusyPause)
	}
}

// outcomeOf names a move that was asked for as asked and answered as got:
// the store sends a task with a pending stop to stopped instead.
func outcomeOf(asked, got task.Status) Outcome {
	switch {
	case got == task.Stopped:
		return OutcomeStopped
	case got == task.Paused:
		return OutcomePaused
	case asked == task.Lost:
		return OutcomeLost
	default:
		return OutcomeRetried
	}
}

// current reads where a task that moved meanwhile is now, for the report;
// "" when it cannot be read, which costs the report a detail and nothing else.
func (r *rescuer) current(ctx context.Context, t *task.Task) task.Status {
	cctx, cancel := r.call(ctx)
	defer cancel()
	now, err := r.s.GetTask(cctx, t.ID)
	if err != nil {
		return ""
	}
	return now.Status
}
