package task

import (
	"encoding/json"
	"time"
)

// Task is one unit of background work and everything flotilla knows about it.
// A store returns a fresh copy on every read; mutating it changes nothing in
// the store.
type Task struct {
	ID     int64
	Kind   string
	Key    string // routes the task to its bucket; "" only on nodes that own every bucket
	Bucket int

	Status Status
	// StatusVersion is the number of transitions the task has been through
	// (its creation counts as the first). Every transition is a
	// compare-and-set on it, and it is also the sequence number of the
	// task's latest audit event.
	StatusVersion int64

	Priority    int           // higher runs first; FIFO within a priority
	RunAt       time.Time     // not claimable before this (database time)
	Attempt     int           // attempts started, counting the current one
	MaxAttempts int           // attempts allowed before failed/timed_out/lost
	Timeout     time.Duration // per attempt; 0 means none

	Payload  json.RawMessage
	Result   json.RawMessage
	Progress json.RawMessage // saved by a handler, seen by the next attempt
	Error    string          // the latest attempt's error

	// Fencing. ClaimSeq moves on at every claim and never goes back. Owner
	// is the incarnation holding the task lease while the task is active,
	// and empty otherwise. Epoch is the bucket epoch of the latest claim.
	ClaimSeq       int64
	Owner          string
	Node           string // node id of the latest attempt
	Epoch          int64
	LeaseExpiresAt time.Time // zero when no lease is held

	// StopRequested and PauseRequested record a stop or a pause issued for
	// the current attempt and not honoured yet. The issuer sets them under
	// the task's row lock, only while the task is in the state it saw;
	// every move out of the active states reads them from the locked row
	// (a pending stop wins over every end but success, a pending pause over
	// a retry or a release) and clears them.
	StopRequested  bool
	PauseRequested bool

	Schedule     string    // the schedule that fired it, if any
	ScheduledFor time.Time // the tick it was fired for (zero without a schedule)
	UniqueKey    string    // at most one unfinished task per unique key

	// Pipeline is the id of the pipeline the task is a step of (0 for a
	// task of its own), and Step its name there.
	Pipeline int64
	Step     string

	// LimitKey is the key per-key limits count the task under ("" means
	// Key); it picked the bucket when set. Resources are what the task
	// needs free on a node to start. WaitReason is the latest reason its
	// bucket's holder gave for not starting it (a limit, a resource).
	LimitKey   string
	Resources  map[string]int64
	WaitReason string

	// Metadata travels with the task apart from its payload, for what is
	// about the submission rather than the work: a trace context (package
	// otel keeps the submitter's there), a request id. Nil when none was
	// given.
	Metadata map[string]string

	CreatedAt  time.Time
	StartedAt  time.Time // start of the latest attempt
	FinishedAt time.Time // when it reached a terminal state
	UpdatedAt  time.Time

	// hooks connect a running attempt's handler to its node (BindAttempt);
	// nil on every copy a store returns.
	hooks AttemptHooks
}

// Ref names one attempt of a task: the fencing token a handler carries.
// Every write about a running task must present it.
type Ref struct {
	ID       int64
	ClaimSeq int64
}

// Ref returns the fencing token of the task's current attempt.
func (t *Task) Ref() Ref { return Ref{ID: t.ID, ClaimSeq: t.ClaimSeq} }

// Event is one audit record: a transition of one task. Events are written in
// the same transaction as the transition they record. Seq equals the task's
// StatusVersion after the transition; the creation event has Seq 1 and an
// empty From.
type Event struct {
	TaskID  int64
	Seq     int64
	From    Status
	To      Status
	At      time.Time // database time
	Node    string
	Epoch   int64
	Attempt int
	Reason  string
	Error   string
}
