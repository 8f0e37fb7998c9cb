package store

import (
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// What the operator's console reads and does beyond the rest of Store: a
// task run again, the pipelines listed, the unfinished tasks counted by kind,
// and the per-minute counts of ended attempts that nodes write.

// RetryRequest asks for a task that ended without success to run again.
type RetryRequest struct {
	ID int64
	// By names who asks ("ui:alice"); it goes into the creation event of
	// every new task, with Reason.
	By     string
	Reason string
}

// RetryLink ties a task that ended to the new task that runs it again.
type RetryLink struct {
	TaskID  int64 // the task that ended
	RetryID int64 // the task created to run it again
	By      string
	At      time.Time // database time
}

// Retries is what a task's retry links say about it: the task it runs again
// (Of) and the task that runs it again (As); nil when there is none.
type Retries struct {
	Of *RetryLink
	As *RetryLink
}

// Retryable reports whether a task in state st may be run again by
// RetryTask: it ended, without success. Final states stay final: a retry
// is a new task.
func Retryable(st task.Status) bool { return st.Terminal() && st != task.Succeeded }

// RetryReason is the reason of the creation event of a task that runs
// another again.
func RetryReason(req RetryRequest, step string) string {
	s := fmt.Sprintf("retry of task %d", req.ID)
	if step != "" {
		s += " (step " + step + ")"
	}
	if req.By != "" {
		s += " by " + req.By
	}
	if req.Reason != "" {
		s += ": " + req.Reason
	}
	return s
}

// CheckRetry refuses a retry of t as it is: ErrConflict unless it ended
// without success, or when retried already (retriedAs is not zero). Every
// store calls it on the task it has read under its lock.
func CheckRetry(t *task.Task, retriedAs int64) error {
	switch {
	case !Retryable(t.Status):
		return fmt.Errorf("task %d is %s: only a task that ended without success (%s) can be run again: %w",
			t.ID, t.Status, retryableNames(), ErrConflict)
	case retriedAs != 0:
		return fmt.Errorf("task %d was run again already, as task %d: retry that one: %w", t.ID, retriedAs, ErrConflict)
	}
	return nil
}

func retryableNames() string {
	var out []byte
	for _, st := range task.TerminalStates() {
		if Retryable(st) {
			if len(out) > 0 {
				out = append(out, ", "...)
			}
			out = append(out, st...)
		}
	}
	return string(out)
}

// RetryTaskOf is the new task that runs t again as a task of its own: the
// same kind, key, bucket, payload, priority, timeout, limit key, resources
// and unique key, with a fresh budget of t's MaxAttempts, due now. It
// keeps no progress, result or schedule tick (a tick fires once).
func RetryTaskOf(t *task.Task) NewTask {
	return NewTask{
		Kind: t.Kind, Key: t.Key, Bucket: t.Bucket, Priority: t.Priority, MaxAttempts: t.MaxAttempts,
		Timeout: t.Timeout, Payload: t.Payload, UniqueKey: t.UniqueKey, LimitKey: t.LimitKey,
		Resources: Resources(t.Resources),
	}
}

// RetryStepOf checks that t is the current task of its step in p, and
// names the step: a pipeline's step is run again with its descendants
// (RetryPlan), and only from its current task.
func RetryStepOf(p Pipeline, t *task.Task) (string, error) {
	st, ok := p.Step(t.Step)
	if !ok {
		return "", fmt.Errorf("task %d names step %q, which pipeline %d does not have: %w", t.ID, t.Step, p.ID, ErrNotFound)
	}
	if st.Task.ID != t.ID {
		return "", fmt.Errorf("task %d is not the current task of step %q of pipeline %d: task %d is; retry that one: %w",
			t.ID, t.Step, p.ID, st.Task.ID, ErrConflict)
	}
	return t.Step, nil
}

// LinkRetried calls link with each step run again (names), its task before
// the retry (in before) and its task after (in after), in names' order,
// and stops at its first error: the links a RetryTask records.
func LinkRetried(before, after Pipeline, names []string, link func(old, fresh int64, step string) error) error {
	for _, n := range names {
		old, _ := before.Step(n)
		fresh, _ := after.Step(n)
		if err := link(old.Task.ID, fresh.Task.ID, n); err != nil {
			return err
		}
	}
	return nil
}

// PipelineFilter selects pipelines in ListPipelines, newest first.
type PipelineFilter struct {
	BeforeID int64 // cursor: only ids below this; 0 starts at the newest
	Limit    int   // 0 means 25; at most MaxListPipelines
}

// MaxListPipelines bounds one ListPipelines.
const MaxListPipelines = 200

// ListLimit is f's limit with its default and bound applied.
func (f PipelineFilter) ListLimit() int {
	switch {
	case f.Limit <= 0:
		return 25
	case f.Limit > MaxListPipelines:
		return MaxListPipelines
	}
	return f.Limit
}

// PipelineSummary is a pipeline with its steps counted by the state of
// their current tasks.
type PipelineSummary struct {
	ID        int64
	Name      string
	Key       string
	Bucket    int
	CreatedAt time.Time
	// Steps counts the steps by the status of each one's current task.
	Steps map[task.Status]int
}

// Total is the number of steps.
func (p PipelineSummary) Total() int {
	n := 0
	for _, c := range p.Steps {
		n += c
	}
	return n
}

// Status is the pipeline's state, as Pipeline.Status derives it.
func (p PipelineSummary) Status() string {
	out := PipelineSucceeded
	for st, n := range p.Steps {
		switch {
		case n == 0:
		case !st.Terminal():
			return PipelineRunning
		case st != task.Succeeded:
			out = PipelineFailed
		}
	}
	return out
}

// SummaryOf counts a pipeline's steps by the state of their current tasks.
func SummaryOf(p Pipeline) PipelineSummary {
	s := PipelineSummary{ID: p.ID, Name: p.Name, Key: p.Key, Bucket: p.Bucket, CreatedAt: p.CreatedAt,
		Steps: map[task.Status]int{}}
	for _, st := range p.Steps {
		s.Steps[st.Task.Status]++
	}
	return s
}

// KindCount is the number of unfinished tasks of one kind in one state.
type KindCount struct {
	Kind   string
	Status task.Status
	Count  int
}

// CountedStatuses are the states UnfinishedByKind counts: those that the
// claim and active indexes hold. Pending and paused tasks wait for
// something other than a node, and no index finds them without reading the
// task table.
func CountedStatuses() []task.Status {
	return []task.Status{task.Scheduled, task.Queued, task.Retrying, task.Running, task.Stopping, task.Pausing}
}

// SortKindCounts orders counts by kind, then by state in the order of
// task.All, as every store answers them.
func SortKindCounts(c []KindCount) {
	order := map[task.Status]int{}
	for i, st := range task.All() {
		order[st] = i
	}
	slices.SortFunc(c, func(a, b KindCount) int {
		if a.Kind != b.Kind {
			if a.Kind < b.Kind {
				return -1
			}
			return 1
		}
		return order[a.Status] - order[b.Status]
	})
}

// MinuteCount is a number of attempts of one kind that ended in one state
// within one minute, as the nodes that ended them counted.
type MinuteCount struct {
	Minute time.Time // the minute's start, UTC
	Kind   string
	Status task.Status // how the attempts ended: succeeded, retrying, failed, ...
	Count  int
}

// MinuteCountsKept is how long the per-minute counts are kept: a day's
// chart, and a day before it. AddMinuteCounts removes older ones.
const MinuteCountsKept = 48 * time.Hour

// CheckMinuteCounts refuses counts no store should add: a minute not on a
// minute's start, a kind CheckName refuses, a state that is not one, a
// count below one. Errors match ErrInvalid.
func CheckMinuteCounts(node string, counts []MinuteCount) error {
	if err := CheckName("node", node, true); err != nil {
		return err
	}
	for i, c := range counts {
		switch {
		case c.Minute.IsZero() || !c.Minute.Equal(c.Minute.Truncate(time.Minute)):
			return fmt.Errorf("count %d: minute %v is not the start of a minute: %w", i, c.Minute, ErrInvalid)
		case !c.Status.Valid():
			return fmt.Errorf("count %d: %q is not a task state: %w", i, c.Status, ErrInvalid)
		case c.Count < 1:
			return fmt.Errorf("count %d: %d attempts: give at least 1: %w", i, c.Count, ErrInvalid)
		}
		if err := CheckName("kind", c.Kind, true); err != nil {
			return fmt.Errorf("count %d: %w", i, err)
		}
	}
	return nil
}

// SortMinuteCounts orders counts by minute, kind, then state, as every
// store answers them.
func SortMinuteCounts(c []MinuteCount) {
	slices.SortFunc(c, func(a, b MinuteCount) int {
		if d := a.Minute.Compare(b.Minute); d != 0 {
			return d
		}
		if a.Kind != b.Kind {
			if a.Kind < b.Kind {
				return -1
			}
			return 1
		}
		switch {
		case a.Status < b.Status:
			return -1
		case a.Status > b.Status:
			return 1
		}
		return 0
	})
}
