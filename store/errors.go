package store

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// Sentinel errors. Every store translates its driver's errors into these at
// the edge, so callers never import a driver.
var (
	// ErrNotFound: no such task, command, schedule or node.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a compare-and-set lost; the row's status_version (or a
	// schedule's next fire time) moved on since the caller read it.
	ErrConflict = errors.New("conflict: changed since it was read")
	// ErrFenced: a write about an active task or a held bucket from an
	// attempt or holder that has been superseded (another claim_seq, another
	// incarnation, another bucket epoch, or a lease no longer held). The
	// write changed nothing.
	ErrFenced = errors.New("fenced: the attempt or lease has been superseded")
	// ErrDuplicate: a unique key already names an unfinished task, or a
	// schedule name is taken.
	ErrDuplicate = errors.New("duplicate")
	// ErrBusy: the row is locked by another transaction, and the caller
	// asked not to wait for it (store.Transition.NoWait). Try again later.
	ErrBusy = errors.New("busy: the task's row is locked by another transaction")
	// ErrNodeAlive: a live process already runs under this node id.
	ErrNodeAlive = errors.New("a live process already uses this node id")
	// ErrBucketCount: the fleet was created with another bucket count.
	ErrBucketCount = errors.New("bucket count differs from the fleet's")
	// ErrSchema: the database schema is not the one this binary knows.
	ErrSchema = errors.New("schema version mismatch")
	// ErrInvalid: a request that no store could carry out (a bad status, a
	// missing kind, a payload that is not JSON).
	ErrInvalid = errors.New("invalid request")
	// ErrPartialPipeline: a pipeline read without a step that another of
	// its steps depends on, as retention leaves it between two batches,
	// which nothing can be planned against. Stores never show one (the
	// pipeline is gone to reads from retention's first batch); the check
	// keeps a retry from waiting forever for a task that is gone.
	ErrPartialPipeline = errors.New("pipeline is partly removed")
)

// PartialPipelineError names the pipeline and the step missing from it, and
// the step that depends on it. It matches ErrPartialPipeline and
// ErrNotFound: the pipeline is being removed.
type PartialPipelineError struct {
	Pipeline int64
	Step     string // the step whose dependency is missing
	Missing  string // the dependency, which has no task left
}

func (e *PartialPipelineError) Error() string {
	return fmt.Sprintf("pipeline %d is partly removed by retention: step %q depends on step %q, which has no task left",
		e.Pipeline, e.Step, e.Missing)
}

func (e *PartialPipelineError) Is(target error) bool {
	return target == ErrPartialPipeline || target == ErrNotFound
}

// ErrSkippedStep is matched by a *SkippedStepError.
var ErrSkippedStep = errors.New("the step was skipped because a dependency ended as its policy refuses")

// SkippedStepError refuses a retry from a step that was skipped because a
// dependency ended in a way its policy does not accept: run again, it would
// be skipped at once. Dependency is the step to retry from instead: the
// nearest ancestor that ended that way and was not itself skipped.
type SkippedStepError struct {
	Pipeline   int64
	Step       string
	Dependency string
	Status     task.Status // how Dependency ended
}

func (e *SkippedStepError) Error() string {
	return fmt.Sprintf("pipeline %d: retried alone, step %q would be skipped at once, because step %q ended %s: "+
		"retry from step %q", e.Pipeline, e.Step, e.Dependency, e.Status, e.Dependency)
}

func (e *SkippedStepError) Is(target error) bool {
	return target == ErrSkippedStep || target == ErrConflict
}

// MaxDependencyResultsBytes bounds what a handler reads of its
// dependencies' results in all (64 MiB): a fan-in of 10,000 steps of 256
// KiB each would otherwise load 2.5 GB into the node at once. A step that
// needs more should pass references (object keys, URLs) in its results.
const MaxDependencyResultsBytes = 64 << 20

// ErrDependencyResultsTooLarge is matched by *DependencyResultsTooLargeError.
var ErrDependencyResultsTooLarge = errors.New("the dependencies' results are too large to read at once")

// DependencyResultsTooLargeError refuses to read the results of a task's
// dependencies that take more bytes in all than the bound.
type DependencyResultsTooLargeError struct {
	Task  int64
	Bytes int64 // the results' size in all, as JSON
	Max   int64
}

func (e *DependencyResultsTooLargeError) Error() string {
	return fmt.Sprintf("the results of task %d's dependencies take %d bytes, more than the %d a task may read at once "+
		"(store.MaxDependencyResultsBytes): have the steps return references (keys, URLs) to their data instead",
		e.Task, e.Bytes, e.Max)
}

func (e *DependencyResultsTooLargeError) Is(target error) bool {
	return target == ErrDependencyResultsTooLarge
}

// BucketCountError says that the fleet's bucket count is fixed and differs
// from the one asked for.
type BucketCountError struct {
	Fleet, Requested int
}

func (e *BucketCountError) Error() string {
	return fmt.Sprintf("this fleet has %d buckets, fixed when it was created; %d were asked for "+
		"(the bucket count cannot change: start every node with %d, or create a new database)",
		e.Fleet, e.Requested, e.Fleet)
}

func (e *BucketCountError) Is(target error) bool { return target == ErrBucketCount }

// SchemaError says that the database schema is older or newer than the one
// this binary was built for.
type SchemaError struct {
	Database, Binary int
}

func (e *SchemaError) Error() string {
	switch {
	case e.Database == 0:
		return "the database has no flotilla schema: create it with flotilla.Migrate (or Store.Migrate)"
	case e.Database < e.Binary:
		return fmt.Sprintf("the database schema is version %d, older than this binary's %d: "+
			"upgrade it with flotilla.Migrate (or Store.Migrate)",
			e.Database, e.Binary)
	default:
		return fmt.Sprintf("the database schema is version %d, newer than this binary's %d: upgrade this binary",
			e.Database, e.Binary)
	}
}

func (e *SchemaError) Is(target error) bool { return target == ErrSchema }

// NodeAliveError names the node id that is already in use and by whom.
type NodeAliveError struct {
	NodeID      string
	Incarnation string
}

func (e *NodeAliveError) Error() string {
	return fmt.Sprintf("node id %q is in use by a live process (incarnation %s): stop it, "+
		"wait for its heartbeat to expire, or give node.Config.NodeID another id", e.NodeID, e.Incarnation)
}

func (e *NodeAliveError) Is(target error) bool { return target == ErrNodeAlive }

// DuplicateError refuses a new task whose unique key an unfinished task
// holds, or whose schedule tick a task was already fired for, and names
// that task. Every store answers a collision with one, without the
// driver's words.
type DuplicateError struct {
	// Index is the refused task's place in its batch; -1 for a batch of
	// one.
	Index int
	// UniqueKey is the key taken; "" for a schedule tick.
	UniqueKey string
	// Schedule and Tick name the tick fired already, for a task fired by a
	// schedule.
	Schedule string
	Tick     time.Time
	// Holder is the task that holds the key or was fired for the tick; 0
	// when it could not be told (it finished meanwhile).
	Holder int64
}

func (e *DuplicateError) Error() string {
	var b strings.Builder
	if e.Index >= 0 {
		fmt.Fprintf(&b, "task at index %d: ", e.Index)
	}
	holder := "an unfinished task"
	if e.Holder > 0 {
		holder = fmt.Sprintf("unfinished task %d", e.Holder)
	}
	if e.UniqueKey != "" {
		fmt.Fprintf(&b, "unique key %s is held by %s", Shorten(e.UniqueKey, 60), holder)
		return b.String()
	}
	fmt.Fprintf(&b, "schedule %s already fired its tick of %s", Shorten(e.Schedule, 60), e.Tick.UTC().Format(time.RFC3339Nano))
	if e.Holder > 0 {
		fmt.Fprintf(&b, ", as task %d", e.Holder)
	}
	return b.String()
}

func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// FindDuplicate names the task of tasks[from:to] that a store refused for a
// unique key or a schedule tick that another task holds: holder looks up
// the task holding a new task's unique key, or fired for its tick (0 and
// nil when there is none). Every store calls it once its unique index has
// refused a batch, so that the error names the holder, whatever the driver
// said. When no holder is found any more (it finished meanwhile), the
// first task of the range with a unique key or a tick is named, without
// its holder.
func FindDuplicate(tasks []NewTask, from, to int, holder func(NewTask) (int64, error)) error {
	index := func(i int) int {
		if len(tasks) == 1 {
			return -1
		}
		return i
	}
	first := -1
	for i := from; i < to; i++ {
		nt := tasks[i]
		if nt.UniqueKey == "" && nt.Schedule == "" {
			continue
		}
		if first < 0 {
			first = i
		}
		id, err := holder(nt)
		if err != nil {
			return fmt.Errorf("find the task that holds the unique key or schedule tick of the task at index %d: %w", i, err)
		}
		if id > 0 {
			return duplicateOf(nt, index(i), id)
		}
	}
	if first < 0 {
		return fmt.Errorf("%w: a unique index refused the batch", ErrDuplicate)
	}
	return duplicateOf(tasks[first], index(first), 0)
}

func duplicateOf(nt NewTask, index int, holder int64) *DuplicateError {
	if nt.UniqueKey != "" {
		return &DuplicateError{Index: index, UniqueKey: nt.UniqueKey, Holder: holder}
	}
	return &DuplicateError{Index: index, Schedule: nt.Schedule, Tick: nt.ScheduledFor, Holder: holder}
}
