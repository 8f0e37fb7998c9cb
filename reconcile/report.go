package reconcile

import (
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// Outcome is what became of one expired task.
type Outcome string

const (
	// OutcomeRetried: moved to retrying; claimable again after Entry.Delay.
	OutcomeRetried Outcome = "retried"
	// OutcomeLost: no attempt was left; the task is lost.
	OutcomeLost Outcome = "lost"
	// OutcomeStopped: a stop was requested; the task is stopped.
	OutcomeStopped Outcome = "stopped"
	// OutcomeConflict: the task moved after it was listed (its late
	// completion landed first, or another rescue did); nothing was written.
	OutcomeConflict Outcome = "conflict"
	// OutcomeFenced: the caller no longer holds the task's bucket under the
	// epoch it named; nothing was written.
	OutcomeFenced Outcome = "fenced"
	// OutcomeRefused: the store refused the move for another reason (the
	// state machine, a task gone); nothing was written.
	OutcomeRefused Outcome = "refused"
	// OutcomePaused: a pause was requested; the task is paused.
	OutcomePaused Outcome = "paused"
	// OutcomeBusy: another transaction holds the task's row locked; it was
	// not waited for, and the next pass tries again.
	OutcomeBusy Outcome = "busy"
	// OutcomeInUse: the caller itself still runs an attempt of the task
	// (Request.InUse); that attempt is cancelled, and the task is rescued
	// by a later pass once its handler has returned, never beside it.
	OutcomeInUse Outcome = "in use"
	// OutcomeFailed: the store call failed (a statement timeout, a lost
	// connection); nothing was written, and the next pass tries again.
	OutcomeFailed Outcome = "failed"
)

// Entry is the rescue of one task.
type Entry struct {
	TaskID int64
	Bucket int
	Kind   string // the task's kind
	From   task.Status
	// To is the status after the move as the store answered it (or as the
	// store had it after a conflict, when it could be read); the planned
	// status for a dry run; From when nothing was written otherwise.
	To      task.Status
	Outcome Outcome
	// PreviousOwner is the incarnation whose attempt was lost, and
	// PreviousEpoch the bucket epoch it claimed the task under.
	PreviousOwner string
	PreviousEpoch int64
	Epoch         int64 // the epoch under which the caller holds the bucket
	Attempt       int   // the lost attempt's number; a retry does not change it
	Delay         time.Duration
	Reason        string // as written to the audit event
	Err           string // why nothing was written, for conflict, fenced and refused
}

// Report is the outcome of one Rescue.
type Report struct {
	DryRun  bool
	Entries []Entry
	// Counts of Entries by Outcome.
	Retried, Lost, Stopped, Paused, Conflicts, Fenced, Refused int
	// Counts of the tasks left for a later pass.
	Busy, InUse, Failed int
	// Passes counts the listings of expired tasks.
	Passes int
	// More is set on a dry run that found a full page: nothing was moved,
	// so listing again would show the same tasks, and the rest is unseen.
	More bool
}

// Rescued counts the tasks moved (or, on a dry run, that would be).
func (r Report) Rescued() int { return r.Retried + r.Lost + r.Stopped + r.Paused }

func (r *Report) add(e Entry) {
	r.Entries = append(r.Entries, e)
	switch e.Outcome {
	case OutcomeRetried:
		r.Retried++
	case OutcomeLost:
		r.Lost++
	case OutcomeStopped:
		r.Stopped++
	case OutcomeConflict:
		r.Conflicts++
	case OutcomeFenced:
		r.Fenced++
	case OutcomeRefused:
		r.Refused++
	case OutcomePaused:
		r.Paused++
	case OutcomeBusy:
		r.Busy++
	case OutcomeInUse:
		r.InUse++
	case OutcomeFailed:
		r.Failed++
	}
}
