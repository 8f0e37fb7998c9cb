package store

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// NewPipeline is a pipeline to create: steps with dependencies, submitted at
// once. Every step lives in the bucket of the pipeline's key, so that the
// holder of that one bucket releases a step in the same transaction as the
// completion of its last dependency.
type NewPipeline struct {
	Name string
	// Key routes every step; "" means Name + "-" + the pipeline's id. The
	// store computes the bucket from it with the fleet's bucket policy.
	Key   string
	Steps []task.Step
}

// Pipeline is a pipeline as stored, with the current task of each step: the
// newest, since a retry creates new tasks for the steps it runs again and
// leaves the old ones, and their trails, as they ended.
type Pipeline struct {
	ID        int64
	Name      string
	Key       string
	Bucket    int
	CreatedAt time.Time
	Steps     []PipelineStep // in the order the steps were added
}

// PipelineStep is one step of a stored pipeline.
type PipelineStep struct {
	Name      string
	DependsOn []task.Dependency
	Task      *task.Task // the step's current task
	// Tries is the number of tasks the step has had: 1, plus one per retry
	// that ran it again.
	Tries int
}

// Pipeline states, derived from the steps' current tasks.
const (
	PipelineRunning   = "running"   // a step is not finished
	PipelineSucceeded = "succeeded" // every step succeeded
	PipelineFailed    = "failed"    // every step finished, not all succeeded
)

// Status is the pipeline's state, derived from its steps' current tasks.
func (p Pipeline) Status() string {
	out := PipelineSucceeded
	for _, s := range p.Steps {
		switch {
		case !s.Task.Status.Terminal():
			return PipelineRunning
		case s.Task.Status != task.Succeeded:
			out = PipelineFailed
		}
	}
	return out
}

// Step finds a step by name.
func (p Pipeline) Step(name string) (PipelineStep, bool) {
	for _, s := range p.Steps {
		if s.Name == name {
			return s, true
		}
	}
	return PipelineStep{}, false
}

// MaxPipelineSteps bounds one pipeline (or one append), so that a submit is
// one transaction of a size the database handles well.
const MaxPipelineSteps = 100_000

// CheckSteps refuses steps that no store could create: none at all, a step
// without a name or a kind, a name twice or one taken (when taken is not
// nil), a dependency on a step that is neither among steps nor one external
// allows (when not nil), a policy that is none of the three, a cycle; and
// what CheckTimeout refuses. It returns the steps in an order
// where every step comes after the new steps it depends on (the input order
// where it already is one), which is the order stores create them in. Each
// error names the step and the problem, and matches ErrInvalid.
func CheckSteps(steps []task.Step, taken, external func(name string) bool) ([]task.Step, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInvalid)
	}
	if len(steps) == 0 {
		return nil, bad("a pipeline needs at least one step")
	}
	if len(steps) > MaxPipelineSteps {
		return nil, bad("%d steps: at most %d at once", len(steps), MaxPipelineSteps)
	}
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		switch {
		case strings.TrimSpace(s.Name) == "":
			return nil, bad("step %d has no name", i)
		case s.Kind == "":
			return nil, bad("step %q has no kind", s.Name)
		case s.MaxAttempts < 0:
			return nil, bad("step %q: max attempts %d is negative", s.Name, s.MaxAttempts)
		}
		if j, dup := index[s.Name]; dup {
			return nil, bad("step name %q is used twice (steps %d and %d): names are unique in a pipeline", s.Name, j, i)
		}
		if taken != nil && taken(s.Name) {
			return nil, bad("step name %q is already a step of the pipeline", s.Name)
		}
		if err := CheckTimeout(s.Timeout); err != nil {
			return nil, bad("step %q: %v", s.Name, err)
		}
		if err := checkStep(s); err != nil {
			return nil, fmt.Errorf("step %s: %w", Shorten(s.Name, 60), err)
		}
		index[s.Name] = i
	}
	for _, s := range steps {
		seen := map[string]bool{}
		for _, d := range s.DependsOn {
			_, isNew := index[d.Step]
			switch {
			case d.Step == s.Name:
				return nil, bad("step %q depends on itself", s.Name)
			case !isNew && (external == nil || !external(d.Step)):
				return nil, bad("step %q depends on %q, which is not a step of the pipeline", s.Name, d.Step)
			case seen[d.Step]:
				return nil, bad("step %q names its dependency %q twice", s.Name, d.Step)
			}
			if err := task.CheckPolicy(d.On); err != nil {
				return nil, bad("step %q: %v", s.Name, err)
			}
			seen[d.Step] = true
		}
	}
	// Depth-first topological order, keeping the input order among steps
	// that do not depend on each other; a step met again while on the
	// current path closes a cycle.
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]int, len(steps))
	order := make([]task.Step, 0, len(steps))
	var path []string
	var visit func(i int) error
	visit = func(i int) error {
		switch state[i] {
		case done:
			return nil
		case onPath:
			start := slices.Index(path, steps[i].Name)
			cycle := append(slices.Clone(path[start:]), steps[i].Name)
			return bad("the dependencies form a cycle: %s", strings.Join(cycle, " -> "))
		}
		state[i] = onPath
		path = append(path, steps[i].Name)
		for _, d := range steps[i].DependsOn {
			if j, isNew := index[d.Step]; isNew {
				if err := visit(j); err != nil {
					return err
				}
			}
		}
		path = path[:len(path)-1]
		state[i] = done
		order = append(order, steps[i])
		return nil
	}
	for i := range steps {
		if err := visit(i); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// checkStep refuses a step that would be refused as a task: every step
// becomes one, so it passes the checks a submitted task does (kind,
// payload, priority, max attempts), and its name is a name as a key is.
func checkStep(s task.Step) error {
	if err := CheckName("step name", s.Name, true); err != nil {
		return err
	}
	return checkNewTask(NewTask{
		Kind: s.Kind, Payload: s.Payload, Priority: s.Priority, MaxAttempts: s.MaxAttempts, Timeout: s.Timeout,
	}, 0)
}

// CheckNewPipeline refuses a pipeline no store could create: a name or key
// CheckName refuses (a name is required), or steps CheckSteps refuses. It
// returns the steps in CheckSteps order.
func CheckNewPipeline(np NewPipeline) ([]task.Step, error) {
	if err := CheckName("pipeline name", np.Name, true); err != nil {
		return nil, err
	}
	if err := CheckName("key", np.Key, false); err != nil {
		return nil, fmt.Errorf("pipeline %s: %w", Shorten(np.Name, 60), err)
	}
	steps, err := CheckSteps(np.Steps, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("pipeline %s: %w", Shorten(np.Name, 60), err)
	}
	return steps, nil
}

// Birth is how a new step starts: queued when every dependency has already
// ended in a way its policy accepts, pending while some has not ended, or
// skipped (created pending and skipped at once, with SkipReason) when one
// ended in a way its policy does not accept.
type Birth struct {
	Status     task.Status // task.Queued, task.Pending or task.Skipped
	DepsLeft   int         // dependencies not yet ended
	SkipReason string
}

// PlanBirths decides how each of the new steps (in CheckSteps order) starts,
// given the status of the task each dependency outside them names (ended
// or not; a missing name is a bug of the caller). Every store creates steps
// by it, so that a submit, an append and a retry start the same way.
func PlanBirths(steps []task.Step, existing func(name string) task.Status) []Birth {
	births := make([]Birth, len(steps))
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		index[s.Name] = i
		b := &births[i]
		for _, d := range s.DependsOn {
			if j, isNew := index[d.Step]; isNew {
				if births[j].Status == task.Skipped && b.SkipReason == "" {
					b.SkipReason = SkippedDependencyReason(d.Step)
				}
				b.DepsLeft++
				continue
			}
			st := existing(d.Step)
			switch {
			case !st.Terminal():
				b.DepsLeft++
			case !task.Accepts(d.Policy(), st) && b.SkipReason == "":
				b.SkipReason = DependencyEndReason(d.Step, st, d.Policy())
			}
		}
		switch {
		case b.SkipReason != "":
			b.Status = task.Skipped
		case b.DepsLeft == 0:
			b.Status = task.Queued
		default:
			b.Status = task.Pending
		}
	}
	return births
}

// Reasons recorded in the audit trail of pipeline moves.
const (
	// ReasonDependenciesMet is the reason of pending -> queued.
	ReasonDependenciesMet = "dependencies met"
)

// DependencyEndReason is the reason a step is skipped when its dependency
// step ended in status, which its policy on does not accept.
func DependencyEndReason(step string, status task.Status, on string) string {
	if status == task.Skipped {
		return SkippedDependencyReason(step)
	}
	return "dependency " + step + " ended " + string(status) + "; this step runs on " + on
}

// SkippedDependencyReason is the reason a step is skipped when its
// dependency step was skipped.
func SkippedDependencyReason(step string) string {
	return "dependency " + step + " was skipped"
}

// RetryPlan names the steps a retry from step from runs again: from itself,
// and every descendant of it whose current task did not succeed. from must
// have ended without success, and every step to run again must have ended:
// ErrConflict otherwise, naming the step. ErrNotFound when from is no step.
// A *PartialPipelineError when a step depends on one p does not have. The
// names come in the pipeline's step order.
func RetryPlan(p Pipeline, from string) ([]string, error) {
	has := make(map[string]bool, len(p.Steps))
	for _, s := range p.Steps {
		has[s.Name] = true
	}
	for _, s := range p.Steps {
		for _, d := range s.DependsOn {
			if !has[d.Step] {
				return nil, &PartialPipelineError{Pipeline: p.ID, Step: s.Name, Missing: d.Step}
			}
		}
	}
	start, ok := p.Step(from)
	if !ok {
		return nil, fmt.Errorf("pipeline %d has no step %q: %w", p.ID, from, ErrNotFound)
	}
	if st := start.Task.Status; !st.Terminal() || st == task.Succeeded {
		return nil, fmt.Errorf("pipeline %d: step %q is %s; a retry starts from a step that ended without success: %w",
			p.ID, from, st, ErrConflict)
	}
	if err := refusedAncestor(p, start); err != nil {
		return nil, err
	}
	dependents := map[string][]string{}
	for _, s := range p.Steps {
		for _, d := range s.DependsOn {
			dependents[d.Step] = append(dependents[d.Step], s.Name)
		}
	}
	descendant := map[string]bool{from: true}
	queue := []string{from}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, c := range dependents[n] {
			if !descendant[c] {
				descendant[c] = true
				queue = append(queue, c)
			}
		}
	}
	var out []string
	for _, s := range p.Steps {
		if !descendant[s.Name] || (s.Name != from && s.Task.Status == task.Succeeded) {
			continue
		}
		if !s.Task.Status.Terminal() {
			return nil, fmt.Errorf("pipeline %d: step %q, which the retry would run again, is still %s: %w",
				p.ID, s.Name, s.Task.Status, ErrConflict)
		}
		out = append(out, s.Name)
	}
	return out, nil
}

// refusedAncestor refuses a retry from a step that its dependencies would
// skip again at once: one of them ended in a way its policy refuses. It
// names the nearest such ancestor that was not itself skipped, the step to
// retry from instead.
func refusedAncestor(p Pipeline, start PipelineStep) error {
	seen := map[string]bool{}
	var walk func(s PipelineStep) (PipelineStep, bool)
	walk = func(s PipelineStep) (PipelineStep, bool) {
		for _, d := range s.DependsOn {
			dep, ok := p.Step(d.Step)
			if !ok || seen[d.Step] || !dep.Task.Status.Terminal() || task.Accepts(d.On, dep.Task.Status) {
				continue
			}
			seen[d.Step] = true
			if dep.Task.Status == task.Skipped {
				if root, found := walk(dep); found {
					return root, true
				}
			}
			return dep, true
		}
		return PipelineStep{}, false
	}
	if dep, found := walk(start); found {
		return &SkippedStepError{Pipeline: p.ID, Step: start.Name, Dependency: dep.Name, Status: dep.Task.Status}
	}
	return nil
}

// RetrySteps turns the steps a RetryPlan names back into steps to create,
// in CheckSteps order.
func RetrySteps(p Pipeline, names []string) []task.Step {
	again := map[string]bool{}
	for _, n := range names {
		again[n] = true
	}
	var out []task.Step
	for _, s := range p.Steps {
		if !again[s.Name] {
			continue
		}
		t := s.Task
		out = append(out, task.Step{
			Name: s.Name, Kind: t.Kind, Payload: t.Payload, Priority: t.Priority,
			MaxAttempts: t.MaxAttempts, Timeout: t.Timeout, DependsOn: s.DependsOn,
		})
	}
	return out
}

// CheckAppend refuses steps appended by the task of step from that no store
// could add: what CheckSteps refuses, a name the pipeline has (taken says
// which), and a dependency on anything but the appending step or the steps
// appended with it. It returns the steps in CheckSteps order, each
// depending on from (on success, unless it names from with another
// policy).
func CheckAppend(from string, steps []task.Step, taken func(name string) bool) ([]task.Step, error) {
	withParent := make([]task.Step, len(steps))
	for i, s := range steps {
		s.DependsOn = slices.Clone(s.DependsOn)
		named := false
		for _, d := range s.DependsOn {
			named = named || d.Step == from
		}
		if !named {
			s.DependsOn = append([]task.Dependency{{Step: from}}, s.DependsOn...)
		}
		withParent[i] = s
	}
	return CheckSteps(withParent, func(name string) bool {
		return name == from || (taken != nil && taken(name))
	}, func(name string) bool { return name == from })
}
