package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/task"
)

// Store is the storage contract. Methods are safe for concurrent use.
type Store interface {
	// Fleet

	// Migrate brings the schema up to the version this binary knows and,
	// on a new database, fixes the fleet's bucket count (0 means
	// bucket.DefaultCount). On an existing fleet a non-zero count that
	// differs is refused with *BucketCountError. Safe to run twice and from
	// two processes at once.
	Migrate(ctx context.Context, numBuckets int) (Meta, error)
	// Meta reads the fleet's metadata. A schema older or newer than this
	// binary's is refused with *SchemaError.
	Meta(ctx context.Context) (Meta, error)
	// Now is the database clock, which every lease decision uses.
	Now(ctx context.Context) (time.Time, error)
	Close()

	// Tasks

	// CreateTasks inserts tasks atomically (all or none) and returns them
	// with ids, in input order. A task whose RunAt (or Delay) is in the
	// future is scheduled, otherwise queued (pending when Pending is set).
	// The creation event (seq 1, from "") is part of the task. Stores with
	// notifications announce the new tasks' buckets once per call.
	CreateTasks(ctx context.Context, tasks []NewTask) ([]*task.Task, error)
	GetTask(ctx context.Context, id int64) (*task.Task, error)
	// ListTasks returns tasks newest first (id descending) matching the
	// filter, at most Limit of them, starting below Filter.BeforeID.
	ListTasks(ctx context.Context, f TaskFilter) ([]*task.Task, error)
	// TaskEvents returns a task's audit trail in sequence order, starting
	// with its creation. ErrNotFound when there is no such task.
	TaskEvents(ctx context.Context, id int64) ([]task.Event, error)
	// Transition moves one task by compare-and-set on its status_version;
	// see Transition for the rules.
	Transition(ctx context.Context, tr Transition) (*task.Task, error)

	// Execution

	// ClaimTasks atomically moves up to Limit due, claimable tasks of the
	// given kinds in the given buckets to running, for the caller's
	// incarnation, and returns them. It takes a task only from a bucket
	// whose lease the caller holds, unexpired, under the epoch it names;
	// every claim adds 1 to claim_seq and to attempt, stamps the bucket
	// epoch, and sets a task lease of LeaseTTL from the database's now.
	// Order: priority descending, then run_at, then id.
	ClaimTasks(ctx context.Context, req ClaimRequest) ([]*task.Task, error)
	// RenewTaskLeases extends, in one statement, the task leases of the
	// named attempts that are still active, owned by owner, and whose
	// bucket lease owner still holds, unexpired, under the task's epoch
	// (the same join as the claim). It does not wait for a row another
	// transaction holds locked: such an attempt is Busy, neither renewed
	// nor lost, and is asked for again at the next renewal, so that one
	// locked row never keeps the others from being renewed. A ref in
	// neither list has lost its lease.
	RenewTaskLeases(ctx context.Context, owner string, refs []task.Ref, ttl time.Duration) (Renewal, error)
	// AdvanceActive applies a batch of fenced transitions out of (or
	// within) the active states; see ActiveTransition. The answer has one
	// entry per input, in input order.
	AdvanceActive(ctx context.Context, owner string, batch []ActiveTransition) ([]Outcome, error)
	// SaveProgress records a running attempt's progress, fenced like
	// AdvanceActive. ErrFenced when the attempt has been superseded.
	SaveProgress(ctx context.Context, owner string, ref task.Ref, progress json.RawMessage) error
	// ExpiredTasks lists active tasks in the given held buckets whose task
	// lease has expired by the database clock, or that were claimed under
	// an epoch older than the one named for their bucket. Never a task of
	// another bucket.
	ExpiredTasks(ctx context.Context, buckets []HeldBucket, limit int) ([]*task.Task, error)
	// BucketBacklog counts queued (claimable and due), waiting (scheduled or
	// retrying, not yet due) and active tasks per bucket that has any.
	BucketBacklog(ctx context.Context) ([]Backlog, error)

	// Bucket leases

	// AcquireBuckets acquires or renews, in one statement, the leases of the
	// given buckets for owner: a bucket free, released, expired, or already
	// owner's is taken for ttl from the database's now; one held by another
	// live owner is left alone. An acquisition that is not a renewal of a
	// live lease adds 1 to the bucket's epoch, even for the same owner. The
	// answer has one entry per requested bucket, ascending.
	AcquireBuckets(ctx context.Context, req AcquireRequest) ([]BucketLease, error)
	// ReleaseBuckets gives up owner's leases on the given buckets (all of
	// owner's when buckets is empty) and returns the buckets released. A
	// lease held by anyone else is untouched. Stores with notifications
	// announce the release.
	ReleaseBuckets(ctx context.Context, owner string, buckets bucket.Set) ([]int, error)
	// ListBuckets returns every bucket of the fleet, ascending; an expired
	// or released lease has an empty Holder.
	ListBuckets(ctx context.Context) ([]BucketLease, error)
	// MarkHandoff records, on each bucket that owner holds under the epoch
	// named, unexpired, the node it is handing the bucket to (To, an
	// incarnation, and ToNode) while it lets its tasks there finish; with
	// To empty, that the hand-off is called off. Readers see the mark as
	// BucketLease.Successor while the lease is live under that epoch. It
	// returns the buckets marked, ascending; a bucket owner does not hold
	// so is left alone.
	MarkHandoff(ctx context.Context, owner string, moves []Handoff) ([]int, error)
	// HandOff gives each bucket that owner holds under the epoch named,
	// unexpired, to its successor, in one statement: the lease's owner
	// becomes To (node ToNode), its epoch goes up by one and it expires ttl
	// from the database's now, so that nobody else may take it meanwhile
	// and every write of the old holder under its epoch is fenced. The
	// successor's next AcquireBuckets finds it held and Acquired; until
	// then readers see HandedBy. It returns the leases handed, ascending,
	// with their new epochs; a bucket owner does not hold so is left
	// alone. Stores with notifications announce the buckets on
	// TopicBuckets.
	HandOff(ctx context.Context, owner string, moves []Handoff, ttl time.Duration) ([]BucketLease, error)
	// PinBuckets records an operator's wish that node (an id) hold the
	// buckets, or, with node empty, removes their pins. The nodes move a
	// pinned bucket by hand-off (package balance); a pin to a node that is
	// not live, or does not declare the bucket, waits until one does.
	// Stores with notifications announce the buckets on TopicBuckets.
	PinBuckets(ctx context.Context, buckets bucket.Set, node string) error

	// Nodes

	// RegisterNode records a node's incarnation as live for ttl. It fails
	// with *NodeAliveError when another incarnation with the same id is
	// live; a dead or stopped one is replaced.
	RegisterNode(ctx context.Context, n NodeInfo, ttl time.Duration) error
	// HeartbeatNode extends the incarnation's liveness by ttl. ErrNotFound
	// when the incarnation is no longer the registered one.
	HeartbeatNode(ctx context.Context, incarnation string, ttl time.Duration) error
	// StopNode marks the incarnation stopped (no longer live).
	StopNode(ctx context.Context, incarnation string) error
	// ListNodes returns every registered node, with Alive computed by the
	// database clock.
	ListNodes(ctx context.Context) ([]NodeInfo, error)

	// Commands

	// IssueCommand records a command for a task, with the task's current
	// owner, sets the task's request flag (StopRequested, PauseRequested)
	// under its row lock, and (stores with notifications) announces it.
	// The answer carries the task's status and node it was issued on.
	// ErrNotFound when there is no such task; ErrConflict when
	// CheckCommandTarget refuses the task as it is now.
	IssueCommand(ctx context.Context, c NewCommand) (Command, error)
	// PendingCommands lists unacknowledged commands for the active tasks
	// whose lease owner holds, oldest first.
	PendingCommands(ctx context.Context, owner string) ([]Command, error)
	// AckCommand records that a command was applied, by whom and with what
	// outcome. Acknowledging twice keeps the first answer and returns
	// ErrConflict. A stop is also acknowledged by the move that stops its
	// task (see Transition).
	AckCommand(ctx context.Context, id int64, by, outcome string) (Command, error)
	GetCommand(ctx context.Context, id int64) (Command, error)

	// Schedules

	// UpsertSchedule creates a schedule, or, as mode says, refuses a
	// schedule of the same name (ErrDuplicate) or replaces its definition.
	// A replacement keeps the creation and last fire times, the next fire
	// time while the spec and time zone are unchanged, and whether the
	// schedule is paused unless mode is UpsertReplaceEnabled. It is one
	// write, with no read before it, so a pause committed at any moment
	// before it is kept.
	UpsertSchedule(ctx context.Context, s Schedule, mode UpsertMode) (Schedule, error)
	GetSchedule(ctx context.Context, name string) (Schedule, error)
	ListSchedules(ctx context.Context) ([]Schedule, error)
	DeleteSchedule(ctx context.Context, name string) error
	// SetScheduleEnabled pauses or resumes a schedule. Resuming a paused
	// schedule moves its next fire time up to resumeAt (when not zero), so
	// that the ticks of the pause are not fired as missed ones.
	SetScheduleEnabled(ctx context.Context, name string, enabled bool, resumeAt time.Time) (Schedule, error)
	// DueSchedules lists enabled schedules in the given buckets whose next
	// fire time has passed by the database clock, earliest first.
	DueSchedules(ctx context.Context, buckets bucket.Set, limit int) ([]Schedule, error)
	// NextScheduleFire returns the earliest next fire time of the enabled
	// schedules in buckets (zero when there is none) and the database's
	// now, so that their holder can sleep until the next tick.
	NextScheduleFire(ctx context.Context, buckets bucket.Set) (next, now time.Time, err error)
	// FireSchedules applies the holder's decisions about due schedules, in
	// one transaction. Each request moves a schedule's next fire time from
	// From to Next by compare-and-set, only while owner holds the schedule's
	// bucket under the request's Epoch, unexpired (ErrFenced otherwise); a
	// schedule since advanced, paused or deleted is left alone (ErrConflict,
	// ErrNotFound). A request with Fire set also creates the task of the
	// tick ScheduledFor. A task already created for that tick (the unique
	// schedule and scheduled_for), or an unfinished task holding the same
	// unique key, means "already fired": Fired is false and the schedule
	// still advances. Requests fail one by one, in their FireResult; the
	// error is for the batch as a whole (invalid requests, the database).
	FireSchedules(ctx context.Context, owner string, reqs []FireRequest) ([]FireResult, error)

	// Pipelines

	// CreatePipeline creates a pipeline and all its steps atomically (all
	// or none), every step in the bucket of the pipeline's key. A step
	// with no dependency is queued; the others are pending until their
	// dependencies end (see PlanBirths). Steps are checked by CheckSteps.
	// Stores with notifications announce the bucket when a step is queued.
	CreatePipeline(ctx context.Context, p NewPipeline) (Pipeline, error)
	// GetPipeline reads a pipeline with the current task of each step.
	// ErrNotFound when there is no such pipeline.
	GetPipeline(ctx context.Context, id int64) (Pipeline, error)
	// DependencyResults reads the results of a task's dependencies, by step
	// name (nil for a dependency that set none); empty for a task outside
	// a pipeline. ErrNotFound when there is no such task. Results that take
	// more than max bytes in all are refused before any is read
	// (*DependencyResultsTooLargeError): a node passes
	// MaxDependencyResultsBytes.
	DependencyResults(ctx context.Context, id int64, max int64) (map[string]json.RawMessage, error)
	// RetryPipeline runs again, as new tasks, the step from and every
	// descendant of it that did not succeed (RetryPlan), and nothing else:
	// the old tasks keep their ends and trails. The new tasks depend on the
	// new tasks of the steps run again, and on the current tasks of the
	// others. It answers the pipeline as it is afterwards. ErrNotFound when
	// there is no such pipeline, or retention has begun to remove it; a
	// *PartialPipelineError when a step depends on one the pipeline lacks.
	RetryPipeline(ctx context.Context, id int64, from string) (Pipeline, error)
	// Limits

	// UpsertLimit creates or replaces the limit of l.Name (CheckLimit).
	UpsertLimit(ctx context.Context, l Limit) (Limit, error)
	// ListLimits returns every limit, by name.
	ListLimits(ctx context.Context) ([]Limit, error)
	// DeleteLimit removes a limit, and its shares. ErrNotFound when there is
	// no such limit.
	DeleteLimit(ctx context.Context, name string) error
	// ClaimLimited is ClaimTasks for a holder with limits: the same claim,
	// one statement, fenced the same way, that takes only what lc leaves
	// room for (see LimitedClaim), clears the wait reason of what it takes,
	// and returns the tasks with their limit keys and resources.
	ClaimLimited(ctx context.Context, req ClaimRequest, lc LimitedClaim) ([]*task.Task, error)
	// AdvanceAndClaimLimited is AdvanceActive of batch followed by
	// ClaimLimited of req and lc, for a holder whose finished attempts free
	// the slots it claims for: the claim sees the batch's tasks as they
	// were left. On PostgreSQL both go in one transaction, one round trip
	// and one commit, so a slot under a limit waits for one write instead
	// of two. Outcomes are nil exactly when nothing was written; with
	// outcomes, a non-nil error is the claim's, which then took nothing.
	// A batch that names a task twice or appends to a pipeline is
	// ErrInvalid here: write it with AdvanceActive.
	AdvanceAndClaimLimited(ctx context.Context, owner string, batch []ActiveTransition, req ClaimRequest,
		lc LimitedClaim) ([]Outcome, []*task.Task, error)
	// ActiveUse lists the active tasks of the given buckets, whoever owns
	// them and under whatever epoch: what a new holder counts against its
	// limits until they are settled or rescued.
	ActiveUse(ctx context.Context, buckets []int) ([]ActiveUse, error)
	// TakeShare renews the owner's share of a fleet-wide limit for TTL and
	// publishes its demand (Running plus its due queued tasks of the kind
	// in Buckets, at most MaxDemand and the limit). The share is
	// GrantShare(N, FairShare(...), others), decided under a lock on the
	// limit that every TakeShare of it takes, so that the sum of the
	// shares and of the tasks that holders whose shares lapsed still run
	// never exceeds N. Found is false when the limit does not exist (or is
	// not a fleet-wide concurrency limit).
	TakeShare(ctx context.Context, req ShareRequest) (Share, error)
	// ListShares returns every holder's share of every fleet-wide limit.
	ListShares(ctx context.Context) ([]ShareUse, error)
	// ListKeyUse counts the active tasks of the whole fleet by kind, node
	// and limit key, in that order: what each holder runs under the
	// limits, read from the rows themselves (`worker limit list`).
	ListKeyUse(ctx context.Context) ([]KeyUse, error)
	// SetWaitReasons writes each reason on the queued (or due scheduled or
	// retrying) tasks of its kind and limit key in the given buckets,
	// while owner holds them under the epochs named, leaving rows that
	// already carry it alone; at most MaxWaitReasonRows rows in all. It
	// returns the rows written.
	SetWaitReasons(ctx context.Context, owner string, buckets []HeldBucket, reasons []WaitReason) (int, error)

	// Retention

	// PruneFinished removes, from one bucket its caller holds, up to Limit
	// finished tasks that have outlived their retention (Retention.Prunable),
	// oldest first, with their audit events, their acknowledged commands and
	// their dependency rows, in one short transaction. It never removes a
	// task an unacknowledged command names, nor a task of a pipeline any of
	// whose tasks is not prunable: a pipeline goes as a whole, its row with
	// the first batch that removes a task of it, so that every read (and a
	// retry) finds it whole or not at all. It reads and locks finished rows
	// (and their pipelines' rows) only, skipping rows another transaction
	// holds, so it never waits for a claim nor makes one wait. Unless req.Owner holds req.Bucket under req.Epoch, unexpired
	// by the database clock, it removes nothing and returns ErrFenced. A dry
	// run counts instead (see PruneRequest.DryRun).
	PruneFinished(ctx context.Context, req PruneRequest) (PruneResult, error)

	// The operator's console (console.go)

	// RetryTask runs again a task that ended without success (Retryable),
	// as a new task: final states stay final. A task of its own becomes
	// RetryTaskOf(it); a pipeline step, which must be its step's current
	// task (RetryStepOf), is run again with its descendants as
	// RetryPipeline does. Every new task's creation event has RetryReason,
	// and a RetryLink ties each task run again to its new task, in the
	// same transaction. It answers the new task of req.ID. ErrNotFound when
	// there is no such task; ErrConflict when CheckRetry refuses it (a task
	// is run again once: the link is unique), or a step is not current.
	RetryTask(ctx context.Context, req RetryRequest) (*task.Task, error)
	// TaskRetries reads the retry links of a task, either way.
	TaskRetries(ctx context.Context, id int64) (Retries, error)
	// ListPipelines returns pipelines newest first (id descending) below
	// f.BeforeID, at most f.ListLimit(), each with its steps counted by
	// the state of their current tasks.
	ListPipelines(ctx context.Context, f PipelineFilter) ([]PipelineSummary, error)
	// UnfinishedByKind counts the tasks in CountedStatuses by kind and
	// state, reading the claim and active indexes only, in
	// SortKindCounts order.
	UnfinishedByKind(ctx context.Context) ([]KindCount, error)
	// AddMinuteCounts adds node's counts (CheckMinuteCounts) to the ones
	// it wrote before for the same minute, kind and state, and removes the
	// counts older than MinuteCountsKept by the database clock.
	AddMinuteCounts(ctx context.Context, node string, counts []MinuteCount) error
	// MinuteCounts sums every node's counts of the minutes from since on,
	// in SortMinuteCounts order.
	MinuteCounts(ctx context.Context, since time.Time) ([]MinuteCount, error)
}

// Warmer is implemented by stores whose first statements cost more than
// the later ones (PostgreSQL: connections to open, statements to parse and
// plan on each). A node calls Warm as it starts, beside its own start-up
// statements, and its Start returns once Warm has; so that its first tasks
// start as fast as the thousandth; a store without it is warm already.
type Warmer interface {
	// Warm opens the connections the store will use at once and readies
	// the hot statements on each, letting each be used as soon as it is
	// ready, so that the node's first statements need not wait for the
	// last. An error leaves the store usable, only cold.
	Warm(ctx context.Context) error
}

// Notifier is implemented by stores that can push events (PostgreSQL's
// LISTEN/NOTIFY). It is separate from Store so that a store without it still
// works: nodes fall back to polling.
type Notifier interface {
	// Listen subscribes to the given topics until ctx ends or the
	// subscription's Close is called. A subscription that loses its
	// connection tries to resume on its own; notifications sent meanwhile
	// are missed, and callers poll anyway, so a missed notification delays
	// work but loses none. Once it has resumed it delivers, for each of its
	// topics, a Notification with Resumed set, so that its consumer polls
	// at once rather than at its next poll (after a database failover, the
	// new primary has every notification's work but sent none of them).
	Listen(ctx context.Context, topics ...Topic) (Subscription, error)
}

// Topic is a kind of notification.
type Topic string

const (
	// TopicTasks: new tasks became claimable. Payload: the buckets, as a
	// bucket set string.
	TopicTasks Topic = "flotilla_tasks"
	// TopicCommands: a command was issued. Payload: a CommandNote, "<command
	// id> <task owner> <task id> <claim_seq> <kind>".
	TopicCommands Topic = "flotilla_commands"
	// TopicBuckets: bucket leases were released, handed over or pinned.
	// Payload: the buckets.
	TopicBuckets Topic = "flotilla_buckets"
	// TopicSchedules: a schedule was created, changed or resumed, and its
	// next tick may come sooner than its holder thinks. Payload: its bucket.
	TopicSchedules Topic = "flotilla_schedules"
)

// Notification is one pushed event.
type Notification struct {
	Topic   Topic
	Payload string
	// Resumed marks the note a subscription delivers after it lost its
	// connection and listens again: anything of Topic may have been
	// missed. Its Payload is empty.
	Resumed bool
}

// Subscription delivers notifications.
type Subscription interface {
	C() <-chan Notification
	Close() error
}

// Meta is the fleet's metadata.
type Meta struct {
	SchemaVersion int
	NumBuckets    int
	CreatedAt     time.Time
}

// NewTask is a task to create.
type NewTask struct {
	Kind        string
	Key         string
	Bucket      int // the caller computes it from Key with the fleet's bucket.Policy
	Priority    int
	RunAt       time.Time       // zero: now; both zero and past mean due at once
	Delay       time.Duration   // added to the database's now when RunAt is zero
	MaxAttempts int             // 0 means DefaultMaxAttempts
	Timeout     time.Duration   // per attempt; 0 means none; see CheckTimeout
	Payload     json.RawMessage // nil means null; otherwise must be valid JSON
	UniqueKey   string
	Pending     bool // created pending (a pipeline child), not queued
	// LimitKey is the key per-key limits count the task under; "" means
	// Key. When set it also picks the bucket, so that one holder enforces
	// each limit key.
	LimitKey string
	// Resources the task needs free on a node to start.
	Resources Resources
	// Metadata is kept with the task apart from its payload (task.Task's
	// Metadata); see CheckMetadata for what is valid.
	Metadata map[string]string

	Schedule     string
	ScheduledFor time.Time
}

// CheckTimeout refuses a per-attempt timeout that a store cannot keep as
// given. Stores keep timeouts in whole milliseconds, PostgreSQL's unit, with
// 0 meaning none: a timeout under 1ms would become no timeout at all, and
// one with a fraction of a millisecond would be cut short, so both are
// refused rather than changed. Every store checks each task and schedule
// with it, so that they all accept the same timeouts. The error names the
// value and what is valid; callers add their context and store.ErrInvalid.
func CheckTimeout(d time.Duration) error {
	const valid = "give 0 for none, or a whole number of milliseconds from 1ms"
	switch {
	case d < 0:
		return fmt.Errorf("timeout %v is negative: %s", d, valid)
	case d > 0 && d < time.Millisecond:
		return fmt.Errorf("timeout %v is under 1ms, which would mean none: %s", d, valid)
	case d%time.Millisecond != 0:
		return fmt.Errorf("timeout %v is not a whole number of milliseconds: %s", d, valid)
	}
	return nil
}

// DefaultMaxAttempts is used when a NewTask leaves MaxAttempts at zero.
const DefaultMaxAttempts = 3

// TaskFilter selects tasks in ListTasks. Zero fields do not filter.
type TaskFilter struct {
	Statuses []task.Status
	Buckets  *bucket.Set
	Kind     string
	Key      string
	Schedule string
	// Node keeps the tasks whose latest attempt ran on this node id.
	Node string
	// Payload keeps the tasks whose payload contains this JSON value, as
	// PostgreSQL's jsonb @> decides: {"customer": 7} matches any object
	// with that member, among others. It must be valid JSON.
	Payload  json.RawMessage
	BeforeID int64 // cursor: only ids below this; 0 starts at the newest
	Limit    int   // 0 means 100
}

// Transition is a compare-and-set of one task from the state it was read in.
//
// It succeeds only if the task's status_version is still Version and the
// table allows the move (*task.TransitionError otherwise); then it writes
// the new state and its audit event in one transaction. Leaving an active
// state clears the owner and the task lease (keeping node, epoch and
// claim_seq for history). Moving to retrying or scheduled sets run_at to
// the database's now plus Delay, and moving to queued sets it to now.
//
// A pending stop wins: when a task leaves an active state for anything but
// succeeded (or another active state), and it is stopping or has a stop
// requested (task.Task.StopRequested, read from the locked row), the
// destination becomes stopped. A pending pause wins over a retry and a
// release: such a move of a task that is pausing or has a pause requested
// goes to paused. A move out of the active states, or to a final state,
// answers the task's pending commands in the same transaction, by the move's
// Node, with LeftOutcome.
//
// Guard, when set, makes the write conditional on Guard.Owner holding the
// task's bucket under Guard.Epoch, unexpired by the database clock (ErrFenced
// otherwise): reconcile rescues tasks only in buckets it holds.
type Transition struct {
	ID      int64
	Version int64
	To      task.Status
	Reason  string
	Error   string
	Node    string        // recorded in the event
	Epoch   int64         // recorded in the event
	Delay   time.Duration // for retrying and scheduled
	Guard   *LeaseGuard
	// NoWait fails the move with ErrBusy at once when another transaction
	// holds the task's row locked, instead of waiting for it: reconcile
	// skips such a task for one pass rather than stall on it. On SQLite,
	// whose every writer locks the whole file, the move waits a moment (50
	// ms, which an ordinary write of another process takes well within)
	// and fails so when another process holds the file's write lock longer.
	NoWait bool
}

// LeaseGuard names the holder and epoch a write requires of the task's bucket.
type LeaseGuard struct {
	Owner string
	Epoch int64
}

// ActiveTransition is one fenced write about an active attempt. It applies
// only if the task is still active with Ref.ClaimSeq and owned by the
// caller's incarnation, and the caller still holds the bucket lease under the
// task's epoch (expired or not: nobody else can have taken it without
// raising the epoch); otherwise its Outcome is ErrFenced and nothing changes.
//
// The rules of Transition apply: the table must allow the move, a pending
// stop wins over anything but succeeded. Moving to queued (a release at
// shutdown) does not count the attempt: attempt goes back by one, claim_seq
// stays moved on. Moving to retrying sets run_at to now + Delay.
type ActiveTransition struct {
	Ref      task.Ref
	To       task.Status
	Reason   string
	Error    string
	Result   json.RawMessage // kept as is when nil
	Progress json.RawMessage // kept as is when nil
	Delay    time.Duration
	Node     string
	// Append adds steps to the task's pipeline (see task.Task.Append) when
	// the move ends the task (a terminal state), in the same transaction;
	// a move that does not end it drops them. Steps that CheckAppend
	// refuses, or appended by a task outside a pipeline, fail the task
	// instead (stopped if a stop is pending), with an error saying why.
	Append []task.Step
}

// CheckOneWrite refuses, with ErrInvalid, a batch that AdvanceAndClaimLimited
// cannot write as one statement: one that names a task twice (its second
// move must see the first applied) or appends steps to a pipeline.
func CheckOneWrite(batch []ActiveTransition) error {
	seen := make(map[int64]bool, len(batch))
	for i, at := range batch {
		if seen[at.Ref.ID] {
			return fmt.Errorf("transition %d names task %d a second time: %w", i, at.Ref.ID, ErrInvalid)
		}
		seen[at.Ref.ID] = true
		if len(at.Append) > 0 {
			return fmt.Errorf("transition %d (task %d) appends to its pipeline: %w", i, at.Ref.ID, ErrInvalid)
		}
	}
	return nil
}

// AdvanceThenClaim is AdvanceAndClaimLimited for a store in which two
// calls cost about what one would: AdvanceActive of batch, then, once it
// has written, ClaimLimited.
func AdvanceThenClaim(ctx context.Context, s Store, owner string, batch []ActiveTransition, req ClaimRequest,
	lc LimitedClaim) ([]Outcome, []*task.Task, error) {
	if err := CheckOneWrite(batch); err != nil {
		return nil, nil, err
	}
	out, err := s.AdvanceActive(ctx, owner, batch)
	if err != nil {
		return nil, nil, err
	}
	if out == nil {
		out = []Outcome{}
	}
	claimed, err := s.ClaimLimited(ctx, req, lc)
	return out, claimed, err
}

// Outcome is the answer to one ActiveTransition.
type Outcome struct {
	ID     int64
	Status task.Status // the state the task is in afterwards
	Err    error       // nil, ErrFenced, ErrNotFound, or *task.TransitionError
}

// HeldBucket names a bucket and the epoch under which the caller holds it.
type HeldBucket struct {
	Bucket int
	Epoch  int64
}

// ClaimRequest asks for tasks to run.
type ClaimRequest struct {
	Owner    string // the caller's incarnation
	Node     string // the caller's node id, recorded on the task and event
	Buckets  []HeldBucket
	Kinds    []string // only these kinds; empty claims nothing
	Limit    int
	LeaseTTL time.Duration
}

// Backlog counts tasks of one bucket.
type Backlog struct {
	Bucket  int
	Queued  int // claimable and due
	Waiting int // scheduled or retrying, not yet due
	Active  int // running, stopping or pausing
	// OldestDue is the run_at of the bucket's oldest queued task: how long
	// the bucket's work has waited for a claim. Zero when none is queued.
	OldestDue time.Time
}

// AcquireRequest asks for bucket leases.
type AcquireRequest struct {
	Owner   string // incarnation
	Node    string
	Buckets bucket.Set
	TTL     time.Duration
	// Take, when set, limits the free, released or expired leases taken to
	// these buckets: another requested bucket nobody holds is left alone
	// (and reported), while the owner's own leases are renewed, and those
	// handed to it taken up, as ever. A balancing node takes only what the
	// assignment gives it. Nil takes every free requested bucket.
	Take *bucket.Set
	// JudgeAt, when set and earlier than the statement's own time on the
	// database's clock, is the time at which the statement judges whether
	// a lease has expired: whether the owner's own lease is live (renewed
	// under its epoch) and whether another's may be taken. A node passes
	// its own reckoning of the database's time, so that a step forward of
	// that clock (a new primary whose clock runs ahead) cannot make a live
	// holder's lease look expired to it. It never makes a lease expire
	// sooner, and a new expiry is still the statement's time + TTL.
	JudgeAt time.Time
}

// JudgeTime is the time at which an AcquireBuckets statement running at now
// judges lease expiry: judgeAt when it is set and earlier, else now.
func JudgeTime(now, judgeAt time.Time) time.Time {
	if !judgeAt.IsZero() && judgeAt.Before(now) {
		return judgeAt
	}
	return now
}

// Handoff names a bucket its holder gives to another node.
type Handoff struct {
	Bucket int
	Epoch  int64  // the epoch under which the giver holds it
	To     string // the successor's incarnation; "" calls a marked hand-off off
	ToNode string // the successor's node id
}

// BucketLease is the state of one bucket's lease.
type BucketLease struct {
	Bucket    int
	Holder    string // incarnation; "" when free, released or expired
	Node      string // node id of the holder; "" with Holder
	Epoch     int64
	ExpiresAt time.Time // zero when free
	// Held and Acquired answer AcquireBuckets: the requester holds the
	// lease after the statement; and it was not holding it (live) before,
	// so the epoch went up.
	Held     bool
	Acquired bool
	// AsOf is the database's clock when AcquireBuckets ran (zero in other
	// answers): a node reckons the database's time from it.
	AsOf time.Time
	// Successor is the node id the holder is handing the bucket to while
	// it lets its tasks there finish (MarkHandoff), since HandoffSince;
	// "" when no hand-off is under way. SuccessorOwner is its incarnation.
	Successor      string
	SuccessorOwner string
	HandoffSince   time.Time
	// HandedBy is the node id that handed the bucket to its holder
	// (HandOff), until the holder takes it up with its next
	// AcquireBuckets; "" otherwise.
	HandedBy string
	// Pin is the node id an operator pinned the bucket to (PinBuckets);
	// "" when none.
	Pin string
}

// NodeInfo is a registered node.
type NodeInfo struct {
	ID          string
	Incarnation string
	Buckets     bucket.Set
	Kinds       []string
	Version     string
	StartedAt   time.Time
	HeartbeatAt time.Time
	ExpiresAt   time.Time
	StoppedAt   time.Time // zero while running
	Alive       bool      // by the database clock, on reads
	// Balance says the node shares the buckets it declares with the other
	// balancing nodes that declare them (package balance); a node that
	// opted out, or whose version predates balancing, has it false.
	Balance bool
	// Leaving says the node is shutting down and handing its buckets on:
	// nobody hands it a bucket any more.
	Leaving bool
}

// Command kinds.
const (
	CommandStop   = "stop"
	CommandPause  = "pause"
	CommandResume = "resume"
)

// Outcomes recorded by acknowledgements. A node may record others, in
// words ("not running here").
const (
	// OutcomeStopped: the task was stopped. Written by the store itself
	// when a move to stopped honours a pending stop.
	OutcomeStopped = "stopped"
	// OutcomePausing: the handler was asked to pause at its next
	// checkpoint.
	OutcomePausing = "pausing"
	// OutcomePaused: the task was paused. Written by the store itself when
	// a move to paused honours a pending pause.
	OutcomePaused = "paused"
	// OutcomeFinishedPrefix starts the outcome of a command that came too
	// late: "already finished: <status>".
	OutcomeFinishedPrefix = "already finished: "
	// OutcomeNotRunningHere: the node that was asked no longer runs the
	// task.
	OutcomeNotRunningHere = "not running here"
)

// Renewal is the answer of RenewTaskLeases.
type Renewal struct {
	Renewed []task.Ref // leases extended by the TTL
	Busy    []task.Ref // rows locked by another transaction: not looked at
}

// NewCommand is a command to issue.
type NewCommand struct {
	TaskID   int64
	Kind     string // CommandStop, CommandPause, CommandResume
	Reason   string
	IssuedBy string
	// ExpectVersion, when not zero, is the task's status_version the issuer
	// decided on: the command is issued only if the task is still there
	// (ErrConflict otherwise), so that a decision made on a running task is
	// never applied to the task it has become since.
	ExpectVersion int64
}

// LeftOutcome is the acknowledgement of a command of kind still pending
// when its task moved to status out of the active states, or to a final
// state: the move honoured it (a stop by stopped, a pause by paused), or the
// command came too late.
func LeftOutcome(kind string, status task.Status) string {
	switch {
	case kind == CommandStop && status == task.Stopped:
		return OutcomeStopped
	case kind == CommandPause && status == task.Paused:
		return OutcomePaused
	case status.Terminal():
		return OutcomeFinishedPrefix + string(status)
	}
	return "not applied: the task is " + string(status)
}

// CheckCommandTarget decides whether command c may be issued for a task in
// status at version: a stop only for an active task, a pause only for a
// running one, and either only at ExpectVersion when it is set. A refusal is
// ErrConflict: the issuer reads the task again and decides anew. Every store
// applies it to the locked row, in the statement that records the command
// and sets the task's request flag.
func CheckCommandTarget(c NewCommand, status task.Status, version int64) error {
	if c.ExpectVersion != 0 && version != c.ExpectVersion {
		return fmt.Errorf("%s command for task %d: it is at status version %d (%s), not %d: %w",
			c.Kind, c.TaskID, version, status, c.ExpectVersion, ErrConflict)
	}
	switch {
	case c.Kind == CommandStop && !status.Active():
		return fmt.Errorf("stop command for task %d: it is %s; a stop command is only for an active task: %w",
			c.TaskID, status, ErrConflict)
	case c.Kind == CommandPause && status != task.Running:
		return fmt.Errorf("pause command for task %d: it is %s; a pause command is only for a running task: %w",
			c.TaskID, status, ErrConflict)
	}
	return nil
}

// Command is a request to a task's lease holder, with its acknowledgement.
type Command struct {
	ID       int64
	TaskID   int64
	Kind     string
	Reason   string
	IssuedBy string
	IssuedAt time.Time
	Owner    string // the task's owner when issued; "" when it was not active
	AckedAt  time.Time
	AckedBy  string
	Outcome  string

	// TaskStatus and TaskNode are the task's status and node when the
	// command was issued, on IssueCommand's answer only (they are not
	// stored): an issuer that did not read the task first learns from them
	// what it issued on.
	TaskStatus task.Status
	TaskNode   string
}

// Acked reports whether the command has been applied.
func (c Command) Acked() bool { return !c.AckedAt.IsZero() }

// Catch-up policies for ticks missed while no node held a schedule's bucket.
const (
	CatchUpSkip   = "skip"
	CatchUpLatest = "latest"
)

// UpsertMode is what UpsertSchedule does with a schedule of the same name.
type UpsertMode int

const (
	// UpsertCreate refuses a schedule of the same name with ErrDuplicate.
	UpsertCreate UpsertMode = iota
	// UpsertReplace replaces the definition of a schedule of the same name
	// but keeps its Enabled: an operator's pause outlives a definition
	// declared again (every node start declares its schedules) or replaced.
	// A new schedule is created with the Enabled given.
	UpsertReplace
	// UpsertReplaceEnabled replaces the definition and Enabled too: it
	// pauses a running schedule, or resumes a paused one. A resumed
	// schedule's next fire time moves up to the NextFireAt given, as with
	// SetScheduleEnabled, so that the ticks of the pause are not fired as
	// missed ones.
	UpsertReplaceEnabled
)

// Check refuses a mode that is none of the above.
func (m UpsertMode) Check() error {
	if m < UpsertCreate || m > UpsertReplaceEnabled {
		return fmt.Errorf("schedule upsert mode %d: want UpsertCreate, UpsertReplace or UpsertReplaceEnabled: %w", int(m), ErrInvalid)
	}
	return nil
}

// Schedule is a periodic task definition. Its tick arithmetic lives in
// package schedule; the store keeps it and fires it.
type Schedule struct {
	Name        string
	Spec        string // a cron expression, or "@every <duration>"
	Timezone    string // IANA name; "" means UTC
	CatchUp     string // CatchUpSkip or CatchUpLatest
	Kind        string
	Key         string
	Bucket      int
	Payload     json.RawMessage
	Priority    int
	MaxAttempts int
	Timeout     time.Duration
	Enabled     bool
	NextFireAt  time.Time
	LastFireAt  time.Time // zero before the first firing
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// FireRequest is the holder's decision about one due schedule: fire the
// tick ScheduledFor (when Fire is set) and advance the schedule from From to
// Next. Ticks between From and Next other than ScheduledFor are skipped.
type FireRequest struct {
	Name  string
	Epoch int64 // the epoch under which the owner holds the schedule's bucket
	// From is the next fire time the decision was made from: the schedule
	// advances only if it still has it. Zero means ScheduledFor.
	From         time.Time
	Fire         bool
	ScheduledFor time.Time
	Next         time.Time
	Task         NewTask // Schedule and ScheduledFor are filled in by the store
}

// FireResult is the outcome of one FireRequest.
type FireResult struct {
	// Fired reports that a task was created for the tick; Task is that
	// task. A tick fired before (or whose unique key was busy) advances
	// with Fired false and Task nil.
	Fired bool
	Task  *task.Task
	// Err is nil when the schedule advanced; otherwise it matches
	// ErrFenced, ErrConflict or ErrNotFound, and nothing was written for
	// this request.
	Err error
}

// CheckFireRequests refuses a batch no store could apply: a request that
// does not move its schedule forward, a firing without a tick, a name twice.
// It fills in a zero From with ScheduledFor. Stores call it before any write.
func CheckFireRequests(reqs []FireRequest) error {
	seen := make(map[string]bool, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		if r.From.IsZero() {
			r.From = r.ScheduledFor
		}
		switch {
		case r.Name == "":
			return fmt.Errorf("fire request %d: no schedule name: %w", i, ErrInvalid)
		case seen[r.Name]:
			return fmt.Errorf("fire request %d: schedule %s appears twice in one batch: %w", i, r.Name, ErrInvalid)
		case r.From.IsZero():
			return fmt.Errorf("schedule %s: no next fire time to advance from: %w", r.Name, ErrInvalid)
		case r.Fire && r.ScheduledFor.IsZero():
			return fmt.Errorf("schedule %s: a firing without a tick: %w", r.Name, ErrInvalid)
		case !r.Next.Truncate(time.Microsecond).After(r.From.Truncate(time.Microsecond)) ||
			(r.Fire && !r.Next.Truncate(time.Microsecond).After(r.ScheduledFor.Truncate(time.Microsecond))):
			// A schedule that does not move forward would fire the same
			// tick for ever. Stores keep microseconds: a Next less than
			// a microsecond after From would be stored as From.
			return fmt.Errorf("schedule %s: next fire time %s is not after %s: %w", r.Name,
				r.Next.UTC().Format(time.RFC3339Nano), r.From.UTC().Format(time.RFC3339Nano), ErrInvalid)
		}
		seen[r.Name] = true
	}
	return nil
}
