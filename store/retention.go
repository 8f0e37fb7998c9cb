package store

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// Default ages after which finished tasks are pruned: a day for the states
// nobody needs to look into, a week for those an operator may have to.
const (
	DefaultRetainSucceeded = 24 * time.Hour
	DefaultRetainFailed    = 7 * 24 * time.Hour
)

// DefaultPruneBatch is the most tasks one prune statement removes when the
// request names no limit: a short transaction whatever the backlog.
const DefaultPruneBatch = 1000

// MaxPruneBatch bounds PruneRequest.Limit: a larger batch would hold its
// row locks and its share of the WAL for too long.
const MaxPruneBatch = 10000

// Ages maps final states to how long a task is kept after it reached one.
// An age of 0 keeps such tasks forever; so does a state the map leaves out.
type Ages map[task.Status]time.Duration

// DefaultAges are the ages of Retention when nothing else is said:
// succeeded, cancelled and skipped a day; failed, timed_out, lost and
// stopped a week.
func DefaultAges() Ages {
	return Ages{
		task.Succeeded: DefaultRetainSucceeded,
		task.Cancelled: DefaultRetainSucceeded,
		task.Skipped:   DefaultRetainSucceeded,
		task.Failed:    DefaultRetainFailed,
		task.TimedOut:  DefaultRetainFailed,
		task.Lost:      DefaultRetainFailed,
		task.Stopped:   DefaultRetainFailed,
	}
}

// Retention says how long finished tasks, their events and their
// acknowledged commands are kept: an age per final state, and for some
// kinds ages of their own that replace the fleet's for the states they name.
type Retention struct {
	Ages  Ages
	Kinds map[string]Ages
}

// DefaultRetention keeps finished tasks for DefaultAges, whatever their kind.
func DefaultRetention() Retention { return Retention{Ages: DefaultAges()} }

// KeepForever prunes nothing: every final state's age is 0.
func KeepForever() Retention {
	out := Retention{Ages: Ages{}}
	for st := range DefaultAges() {
		out.Ages[st] = 0
	}
	return out
}

// WithDefaults fills the final states r.Ages leaves out with DefaultAges, so
// that naming one state's age keeps the defaults of the others. An explicit
// 0 stays: it keeps forever.
func (r Retention) WithDefaults() Retention {
	out := Retention{Ages: DefaultAges(), Kinds: map[string]Ages{}}
	maps.Copy(out.Ages, r.Ages)
	for kind, ages := range r.Kinds {
		out.Kinds[kind] = maps.Clone(ages)
	}
	return out
}

// Age is how long a finished task of kind in state st is kept; 0 forever.
func (r Retention) Age(kind string, st task.Status) time.Duration {
	if age, ok := r.Kinds[kind][st]; ok {
		return age
	}
	return r.Ages[st]
}

// Keeps reports whether r prunes nothing at all.
func (r Retention) Keeps() bool { return len(r.MinAges()) == 0 }

// MinAges is, per final state, the smallest age above 0 any kind has for
// it: no task in that state finished more recently than that can go.
// States that every kind keeps forever are absent.
func (r Retention) MinAges() Ages {
	out := Ages{}
	consider := func(st task.Status, age time.Duration) {
		if age > 0 && (out[st] == 0 || age < out[st]) {
			out[st] = age
		}
	}
	for st, age := range r.Ages {
		consider(st, age)
	}
	for _, ages := range r.Kinds {
		for st, age := range ages {
			consider(st, age)
		}
	}
	return out
}

// RetentionRule is one age of a Retention, flattened: Kind "" is the
// fleet's age for Status, any other kind's replaces it for that kind.
type RetentionRule struct {
	Kind   string
	Status task.Status
	Age    time.Duration
}

// Rules flattens r, in a stable order: the fleet's ages by state, then each
// kind's by kind and state.
func (r Retention) Rules() []RetentionRule {
	var out []RetentionRule
	for _, st := range task.TerminalStates() {
		if age, ok := r.Ages[st]; ok {
			out = append(out, RetentionRule{Status: st, Age: age})
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(r.Kinds)) {
		for _, st := range task.TerminalStates() {
			if age, ok := r.Kinds[kind][st]; ok {
				out = append(out, RetentionRule{Kind: kind, Status: st, Age: age})
			}
		}
	}
	return out
}

// Check refuses a retention no store could apply: a state that is not
// final, a negative age, an override without a kind.
func (r Retention) Check() error {
	if err := r.Ages.check("retention"); err != nil {
		return err
	}
	for kind, ages := range r.Kinds {
		if kind == "" {
			return fmt.Errorf("retention: a per-kind override names no kind: %w", ErrInvalid)
		}
		if err := ages.check("retention of kind " + kind); err != nil {
			return err
		}
	}
	return nil
}

func (a Ages) check(what string) error {
	for st, age := range a {
		if !st.Terminal() {
			return fmt.Errorf("%s: %q is not a final state (want one of %s): %w", what, st, finalStateNames(), ErrInvalid)
		}
		if age < 0 {
			return fmt.Errorf("%s: age %v of %s is negative (want 0 to keep forever, or a positive duration): %w",
				what, age, st, ErrInvalid)
		}
	}
	return nil
}

func finalStateNames() string {
	names := make([]string, 0, 7)
	for _, st := range task.TerminalStates() {
		names = append(names, string(st))
	}
	return strings.Join(names, ", ")
}

// ParseAges reads "STATE=AGE,STATE=AGE" (for example
// "succeeded=24h,failed=168h"), with "all" standing for every final state
// and an age of 0 keeping forever. Later entries win over earlier ones, so
// "all=0,failed=720h" keeps everything but failed tasks forever.
func ParseAges(text string) (Ages, error) {
	out := Ages{}
	if strings.TrimSpace(text) == "" {
		return nil, fmt.Errorf("retention %q: empty; want STATE=AGE[,STATE=AGE...] with STATE one of all, %s: %w",
			text, finalStateNames(), ErrInvalid)
	}
	for _, part := range strings.Split(text, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("retention entry %q: want STATE=AGE, as in succeeded=24h: %w", part, ErrInvalid)
		}
		name = strings.ToLower(strings.TrimSpace(name))
		age, err := parseAge(strings.TrimSpace(value))
		if err != nil {
			return nil, fmt.Errorf("retention entry %q: %w", part, err)
		}
		if name == "all" {
			for _, st := range task.TerminalStates() {
				out[st] = age
			}
			continue
		}
		st := task.Status(name)
		if !st.Terminal() {
			return nil, fmt.Errorf("retention entry %q: %q is not a final state (want all, %s): %w",
				part, name, finalStateNames(), ErrInvalid)
		}
		out[st] = age
	}
	return out, nil
}

// ParseKindAges reads "KIND:STATE=AGE[,STATE=AGE...]", the ages of one kind.
func ParseKindAges(text string) (string, Ages, error) {
	kind, rest, ok := strings.Cut(text, ":")
	kind = strings.TrimSpace(kind)
	if !ok || kind == "" {
		return "", nil, fmt.Errorf("kind retention %q: want KIND:STATE=AGE[,STATE=AGE...], as in email:succeeded=1h: %w",
			text, ErrInvalid)
	}
	ages, err := ParseAges(rest)
	if err != nil {
		return "", nil, fmt.Errorf("kind %s: %w", kind, err)
	}
	return kind, ages, nil
}

func parseAge(value string) (time.Duration, error) {
	if value == "0" {
		return 0, nil
	}
	age, err := time.ParseDuration(value)
	if err != nil || age < 0 {
		return 0, fmt.Errorf("age %q: want 0 (keep forever) or a positive duration such as 90m, 24h or 168h: %w",
			value, ErrInvalid)
	}
	return age, nil
}

// PruneRequest asks a bucket's holder to remove finished tasks that have
// outlived their retention, with their events and acknowledged commands.
type PruneRequest struct {
	// Owner holds Bucket under Epoch, unexpired: the store removes nothing
	// otherwise (ErrFenced), so that only the bucket's holder prunes it.
	Owner  string
	Bucket int
	Epoch  int64
	// Retention as the store applies it: a state it leaves out is kept
	// forever (see Retention.WithDefaults).
	Retention Retention
	// Limit is the most tasks removed, in one short transaction; 0 means
	// DefaultPruneBatch, and more than MaxPruneBatch is refused.
	Limit int
	// DryRun removes nothing, takes no lock, needs no lease and has no
	// limit: it counts every task a run would remove now.
	DryRun bool
}

// PruneResult is what a prune removed (or, dry, would remove).
type PruneResult struct {
	Tasks    int
	Events   int // audit events removed with them (not counted dry)
	Commands int // acknowledged commands removed with them (not counted dry)
	// ByStatus counts the tasks per final state, with the oldest end.
	ByStatus map[task.Status]PruneCount
}

// PruneCount is the tasks of one final state a prune removed.
type PruneCount struct {
	Tasks  int
	Oldest time.Time // the earliest finished_at among them
}

// Add counts one task of state st that finished at.
func (r *PruneResult) Add(st task.Status, finished time.Time) {
	r.AddMany(st, 1, finished)
}

// AddMany counts n tasks of state st whose oldest finished at oldest.
func (r *PruneResult) AddMany(st task.Status, n int, oldest time.Time) {
	if n == 0 {
		return
	}
	if r.ByStatus == nil {
		r.ByStatus = map[task.Status]PruneCount{}
	}
	c := r.ByStatus[st]
	c.Tasks += n
	if c.Oldest.IsZero() || oldest.Before(c.Oldest) {
		c.Oldest = oldest
	}
	r.ByStatus[st] = c
	r.Tasks += n
}

// CheckPrune refuses a request no store could carry out, and fills in the
// default limit.
func CheckPrune(req *PruneRequest) error {
	if err := req.Retention.Check(); err != nil {
		return err
	}
	if !req.DryRun && req.Owner == "" {
		return fmt.Errorf("prune bucket %d: no owner: %w", req.Bucket, ErrInvalid)
	}
	if req.Bucket < 0 {
		return fmt.Errorf("prune bucket %d: no such bucket: %w", req.Bucket, ErrInvalid)
	}
	switch {
	case req.Limit == 0:
		req.Limit = DefaultPruneBatch
	case req.Limit < 0 || req.Limit > MaxPruneBatch:
		return fmt.Errorf("prune bucket %d: batch of %d tasks: want 1 to %d: %w", req.Bucket, req.Limit, MaxPruneBatch, ErrInvalid)
	}
	return nil
}

// Prunable reports whether a task may be pruned at now under r: it is
// final, its kind's age for its state is above 0 and has passed since it
// finished, and no unacknowledged command names it. A task of a pipeline
// goes only with the whole pipeline: the stores also require every other
// task of the pipeline to be prunable.
func (r Retention) Prunable(t *task.Task, unackedCommands bool, now time.Time) bool {
	if !t.Status.Terminal() || unackedCommands || t.FinishedAt.IsZero() {
		return false
	}
	age := r.Age(t.Kind, t.Status)
	return age > 0 && !t.FinishedAt.After(now.Add(-age))
}
