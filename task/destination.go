package task

import "time"

// Destination decides where a requested move of t to want goes, under the
// rules every store applies to the row it has locked (the PostgreSQL store
// writes them in SQL, stopDestinationSQL; the others call this):
//
//   - a pending stop wins over every way an attempt can end except
//     success: an active task that is stopping, or has a stop requested,
//     is stopped instead (the record tells the truth about work that was
//     done, so success stands);
//   - a pending pause wins over a retry and a release: an active task that
//     is pausing, or has a pause requested, is paused instead;
//   - any other move must be allowed by the table (*TransitionError).
//
// The redirects are decided before the table is consulted, because the
// table lists what a stopping task can become, not every outcome its
// handler may report.
func Destination(t *Task, want Status) (Status, error) {
	if endsAttempt(t.Status, want) && (t.Status == Stopping || t.StopRequested) {
		return Stopped, nil
	}
	if t.Status.Active() && (want == Retrying || want == Queued) && (t.Status == Pausing || t.PauseRequested) {
		return Paused, nil
	}
	if !CanTransition(t.Status, want) {
		return "", &TransitionError{ID: t.ID, From: t.Status, To: want}
	}
	return want, nil
}

// ResumeDestination is where a paused task asked to move to want goes when
// it still waits for depsLeft dependencies: a pipeline step paused while it
// was pending is resumed to pending, not queued or scheduled, so that it
// runs only once its last dependency ends and releases it. Every store
// decides this on the row it has locked, with the count it holds there.
func ResumeDestination(from, want Status, depsLeft int) Status {
	if from == Paused && depsLeft > 0 && (want == Queued || want == Scheduled) {
		return Pending
	}
	return want
}

// attemptEnds are the states an attempt can end in other than success:
// every state the table reaches from an active state that is not active.
var attemptEnds = func() map[Status]bool {
	out := map[Status]bool{}
	for _, from := range All() {
		if !from.Active() {
			continue
		}
		for _, to := range Next(from) {
			if !to.Active() && to != Succeeded {
				out[to] = true
			}
		}
	}
	return out
}()

// endsAttempt reports whether a move from state from to state to ends an
// active attempt without success.
func endsAttempt(from, to Status) bool {
	return from.Active() && attemptEnds[to]
}

// ApplyMove sets the fields a move of t to status to changes besides its
// status and version, by the rules every store applies (the PostgreSQL
// store writes them in SQL, transitionSetSQL): leaving the active states
// ends the attempt (no owner, no task lease, the attempt's error, requests
// answered); a release to queued does not count the attempt and runs at
// now; retrying and scheduled run at delayed, the store's now plus the
// move's delay in its own precision. It reports whether the task is
// claimable at once, so that the store announces it.
func ApplyMove(t *Task, to Status, errText string, now, delayed time.Time) (claimableNow bool) {
	from := t.Status
	if from.Active() && !to.Active() {
		// Node, epoch and claim_seq stay for history.
		t.Owner = ""
		t.LeaseExpiresAt = time.Time{}
		t.Error = errText
		t.StopRequested, t.PauseRequested = false, false
	} else if errText != "" {
		t.Error = errText
	}
	switch to {
	case Queued:
		t.RunAt = now
		if from.Active() && t.Attempt > 0 {
			// A release: the attempt was handed back unfinished, so it does
			// not count. claim_seq stays moved on.
			t.Attempt--
		}
		return true
	case Retrying, Scheduled:
		t.RunAt = delayed
		return !t.RunAt.After(now)
	}
	return false
}
