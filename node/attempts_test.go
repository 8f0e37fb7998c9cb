package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

func newTestAttempt(id, claimSeq int64) *attempt {
	a := &attempt{ref: task.Ref{ID: id, ClaimSeq: claimSeq}}
	a.ctx, a.cancel = context.WithCancelCause(context.Background())
	return a
}

// Two attempts of one task on a node: one given up (its lease was lost)
// whose handler has not returned yet, and the live one. A command is for the
// live one, whichever the registry happens to hold first.
func TestACommandAppliesToTheLiveAttemptNotAnAbandonedOne(t *testing.T) {
	for _, abandonedSeq := range []int64{1, 3} {
		r := newAttempts()
		abandoned, live := newTestAttempt(7, abandonedSeq), newTestAttempt(7, 2)
		r.add(abandoned)
		r.add(live)
		r.add(newTestAttempt(8, 1))
		if !abandoned.abandon(ErrTaskLeaseLost) {
			t.Fatal("abandon of a running attempt reported nothing done")
		}
		if got := r.current(7); got != live {
			t.Errorf("with the abandoned attempt at claim_seq %d, current(7) = %+v, want the live attempt at claim_seq 2",
				abandonedSeq, got.ref)
		}
		if got := r.ofTask(7); len(got) != 2 {
			t.Errorf("ofTask(7) = %d attempts, want both", len(got))
		}
	}
}

func TestAbandonIsOnceAndNeverAfterTheHandlerReturned(t *testing.T) {
	a := newTestAttempt(1, 1)
	if !a.abandon(ErrBucketLost) || a.abandon(ErrTaskLeaseLost) {
		t.Fatal("abandon must take effect once")
	}
	if cause := context.Cause(a.ctx); !errors.Is(cause, ErrBucketLost) {
		t.Errorf("cause %v, want the first reason", cause)
	}
	done := newTestAttempt(2, 1)
	done.done = true
	if done.abandon(ErrBucketLost) {
		t.Error("an attempt whose handler returned was abandoned: its outcome stands")
	}
}

func TestTheRegistryCountsHandlersAndAttempts(t *testing.T) {
	r := newAttempts()
	a, b := newTestAttempt(1, 1), newTestAttempt(2, 1)
	r.add(a)
	r.add(b)
	_, _, changed := r.counts()
	r.returned(a, false) // outcome queued: still registered
	select {
	case <-changed:
	default:
		t.Error("returned did not signal a change")
	}
	if reg, active, _ := r.counts(); reg != 2 || active != 1 {
		t.Errorf("after one handler returned: %d registered, %d active; want 2, 1", reg, active)
	}
	r.returned(b, true) // abandoned: leaves at once
	r.settle([]*attempt{a})
	if reg, active, _ := r.counts(); reg != 0 || active != 0 {
		t.Errorf("after settling: %d registered, %d active; want 0, 0", reg, active)
	}
}

func TestAResultWithANULCharacterCannotBeStored(t *testing.T) {
	for _, c := range []struct {
		result string
		ok     bool
	}{
		{``, true},
		{`{"a":"b"}`, true},
		{`{"a":"\\u0000"}`, true}, // an escaped backslash, then the text u0000
		{`{"a":"\u0000"}`, false},
		{`["x\u0000y"]`, false},
		{`{"a":"\\\u0000"}`, false},
		{`{"a":`, false},
	} {
		if got := validResult([]byte(c.result)); got != c.ok {
			t.Errorf("validResult(%s) = %v, want %v", c.result, got, c.ok)
		}
	}
}

// heldExecutor keeps each attempt's run until the test lets it go, as a
// goroutine the scheduler has not run yet.
type heldExecutor struct{ runs chan func() }

func (e heldExecutor) Execute(run func()) { e.runs <- run }

// After a long pause of the process, a handler's goroutine may run before
// the timers that enforce its leases' deadlines: it must not start the
// work once a deadline has passed.
func TestAHandlerDoesNotStartPastItsTaskLeaseDeadline(t *testing.T) {
	b := setup(t)
	exec := heldExecutor{runs: make(chan func(), 1)}
	cfg := b.config(t, "paused")
	cfg.Executor = exec
	started := make(chan struct{}, 1)
	n := b.startNode(t, cfg, map[string]Handler{"work": func(context.Context, *task.Task) error {
		started <- struct{}{}
		return nil
	}})
	tk := submit(t, n, SubmitRequest{Kind: "work", Key: "k"})
	run := receive(t, exec.runs, "the attempt's run")
	for _, a := range n.attempts.ofTask(tk.ID) {
		a.mu.Lock()
		a.leaseDeadline = time.Now().Add(-time.Second) // passed while the process stood still
		a.mu.Unlock()
	}
	run()
	select {
	case <-started:
		t.Fatal("the handler started past its task lease's deadline")
	default:
	}
	if got := b.get(t, tk.ID); got.Status != task.Running || got.ClaimSeq != 1 {
		t.Errorf("task is %s at claim_seq %d: nothing may be written for an attempt given up", got.Status, got.ClaimSeq)
	}
}
