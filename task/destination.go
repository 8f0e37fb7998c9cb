package task

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
