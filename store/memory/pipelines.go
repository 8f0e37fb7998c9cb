package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// pipelineRecord is one pipeline: its steps in the order they were added,
// each with its dependencies and the tasks it has had (the last is
// current).
type pipelineRecord struct {
	id        int64
	name, key string
	bucket    int
	createdAt time.Time
	steps     []*stepRecord
	byName    map[string]*stepRecord
	// removing is set when retention has removed a task of the pipeline:
	// from then on the pipeline is gone to every read, as on the other
	// stores, whose first batch removes its row, while its remaining
	// tasks wait for the next batches.
	removing bool
}

type stepRecord struct {
	name      string
	dependsOn []task.Dependency
	tasks     []int64
}

func (s *stepRecord) current() int64 { return s.tasks[len(s.tasks)-1] }

// depLink is one dependency of a task: the step's name and the task it
// named when the task was created.
type depLink struct {
	step string
	id   int64
}

// depEdge is the same dependency seen from the task depended on.
type depEdge struct {
	task int64  // the dependent
	step string // the dependency's step name
	on   string // the dependent's policy for it
}

func pipelineNotFound(id int64) error {
	return fmt.Errorf("pipeline %d: %w", id, store.ErrNotFound)
}

// CreatePipeline creates a pipeline and its steps atomically.
func (s *Store) CreatePipeline(ctx context.Context, np store.NewPipeline) (store.Pipeline, error) {
	steps, err := store.CheckNewPipeline(np)
	if err != nil {
		return store.Pipeline{}, err
	}
	for _, st := range steps {
		if err := checkJSON("payload of step "+strconv.Quote(st.Name), st.Payload); err != nil {
			return store.Pipeline{}, err
		}
	}
	db, err := s.begin(ctx)
	if err != nil {
		return store.Pipeline{}, err
	}
	defer db.mu.Unlock()

	now := db.now()
	p := &pipelineRecord{
		id: int64(len(db.pipelines) + 1), name: np.Name, key: np.Key, createdAt: now,
		byName: map[string]*stepRecord{},
	}
	if p.key == "" {
		p.key = np.Name + "-" + strconv.FormatInt(p.id, 10)
	}
	policy, err := bucket.NewPolicy(db.fleet.NumBuckets)
	if err != nil {
		return store.Pipeline{}, err
	}
	p.bucket = policy.Of(p.key)
	db.pipelines = append(db.pipelines, p)
	db.createSteps(p, steps, moveDetails{}, now)
	return db.pipelineView(p), nil
}

// createSteps creates steps (in CheckSteps order) of pipeline p as
// PlanBirths decides, linking each to the tasks its dependencies name now.
// m supplies the node and epoch of the skips it records.
func (db *database) createSteps(p *pipelineRecord, steps []task.Step, m moveDetails, now time.Time) {
	births := store.PlanBirths(steps, func(name string) task.Status {
		return db.task(p.byName[name].current()).Status
	})
	recs := make([]*taskRecord, len(steps))
	var due []int
	for i, st := range steps {
		rec := db.insertTask(store.NewTask{
			Kind: st.Kind, Key: p.key, Bucket: p.bucket, Priority: st.Priority, MaxAttempts: st.MaxAttempts,
			Timeout: st.Timeout, Payload: st.Payload, Pending: births[i].Status != task.Queued,
		}, now)
		rec.Pipeline, rec.Step, rec.depsLeft = p.id, st.Name, births[i].DepsLeft
		sr := p.byName[st.Name]
		if sr == nil {
			sr = &stepRecord{name: st.Name, dependsOn: append([]task.Dependency(nil), st.DependsOn...)}
			p.byName[st.Name] = sr
			p.steps = append(p.steps, sr)
		}
		for _, d := range st.DependsOn {
			dep := p.byName[d.Step].current()
			rec.deps = append(rec.deps, depLink{step: d.Step, id: dep})
			db.dependents[dep] = append(db.dependents[dep], depEdge{task: rec.ID, step: d.Step, on: d.Policy()})
		}
		sr.tasks = append(sr.tasks, rec.ID)
		recs[i] = rec
		if rec.Status == task.Queued {
			due = append(due, rec.Bucket)
		}
	}
	db.announceTasks(due...)
	for i, b := range births {
		// A skip already made by an earlier one's propagation stands.
		if b.Status == task.Skipped && recs[i].Status == task.Pending {
			db.move(recs[i], task.Skipped, moveDetails{reason: b.SkipReason, node: m.node, epoch: m.epoch}, now)
		}
	}
}

// resolveDependents is called by move when a pipeline task ends: each
// pending task that depends on it has one dependency fewer to wait for; it
// is skipped, with its descendants, when the end is not one its policy
// accepts, and queued when it was the last one. A step paused while pending
// counts down and is skipped alike, but is not queued: resuming it does.
func (db *database) resolveDependents(rec *taskRecord, m moveDetails, now time.Time) {
	for _, e := range db.dependents[rec.ID] {
		child := db.task(e.task)
		if !waitsForDependencies(child) {
			continue
		}
		child.depsLeft--
		switch {
		case !task.Accepts(e.on, rec.Status):
			db.move(child, task.Skipped, moveDetails{
				reason: store.DependencyEndReason(e.step, rec.Status, e.on), node: m.node, epoch: m.epoch,
			}, now)
		case child.depsLeft == 0 && child.Status == task.Pending:
			db.move(child, task.Queued, moveDetails{reason: store.ReasonDependenciesMet, node: m.node, epoch: m.epoch}, now)
		}
	}
}

// waitsForDependencies reports whether rec still counts its dependencies
// down: it is pending, or was paused while pending with some left.
func waitsForDependencies(rec *taskRecord) bool {
	return rec.Status == task.Pending || (rec.Status == task.Paused && rec.depsLeft > 0)
}

// checkAppend checks steps that rec's attempt appends.
func (db *database) checkAppend(rec *taskRecord, steps []task.Step) ([]task.Step, error) {
	if rec.Pipeline == 0 {
		return nil, fmt.Errorf("appending steps: task %d is not a step of a pipeline: %w", rec.ID, store.ErrInvalid)
	}
	p := db.pipelines[rec.Pipeline-1]
	out, err := store.CheckAppend(rec.Step, steps, func(name string) bool { return p.byName[name] != nil })
	if err != nil {
		return nil, fmt.Errorf("appending steps to pipeline %d: %w", p.id, err)
	}
	for _, st := range out {
		if err := checkJSON("payload of step "+strconv.Quote(st.Name), st.Payload); err != nil {
			return nil, fmt.Errorf("appending steps to pipeline %d: %w", p.id, err)
		}
	}
	return out, nil
}

// appendSteps creates the steps rec appended, now that it has ended.
func (db *database) appendSteps(rec *taskRecord, steps []task.Step, m moveDetails, now time.Time) {
	db.createSteps(db.pipelines[rec.Pipeline-1], steps, m, now)
}

// GetPipeline reads a pipeline with each step's current task.
func (s *Store) GetPipeline(ctx context.Context, id int64) (store.Pipeline, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return store.Pipeline{}, err
	}
	defer db.mu.Unlock()
	p := db.pipeline(id)
	if p == nil {
		return store.Pipeline{}, pipelineNotFound(id)
	}
	return db.pipelineView(p), nil
}

// pipeline is the pipeline id as reads see it: nil once retention has
// begun to remove it.
func (db *database) pipeline(id int64) *pipelineRecord {
	if id < 1 || id > int64(len(db.pipelines)) {
		return nil
	}
	if p := db.pipelines[id-1]; p != nil && !p.removing {
		return p
	}
	return nil
}

// pipelineView shows each step by its current task and counts its tries.
func (db *database) pipelineView(p *pipelineRecord) store.Pipeline {
	out := store.Pipeline{ID: p.id, Name: p.name, Key: p.key, Bucket: p.bucket, CreatedAt: p.createdAt}
	for _, sr := range p.steps {
		var current *taskRecord
		tries := 0
		for _, id := range sr.tasks {
			if rec := db.task(id); rec != nil {
				current, tries = rec, tries+1
			}
		}
		if current == nil {
			continue
		}
		out.Steps = append(out.Steps, store.PipelineStep{
			Name: sr.name, DependsOn: append([]task.Dependency(nil), sr.dependsOn...),
			Task: current.snapshot(), Tries: tries,
		})
	}
	return out
}

// DependencyResults reads the results of a task's dependencies, once their
// size in all is known to be within max.
func (s *Store) DependencyResults(ctx context.Context, id int64, max int64) (map[string]json.RawMessage, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	rec := db.task(id)
	if rec == nil {
		return nil, taskNotFound(id)
	}
	var size int64
	for _, d := range rec.deps {
		size += int64(len(db.task(d.id).Result))
	}
	if size > max {
		return nil, &store.DependencyResultsTooLargeError{Task: id, Bytes: size, Max: max}
	}
	out := make(map[string]json.RawMessage, len(rec.deps))
	for _, d := range rec.deps {
		out[d.step] = bytes.Clone(db.task(d.id).Result)
	}
	return out, nil
}

// RetryPipeline runs a step and its unsucceeded descendants again.
func (s *Store) RetryPipeline(ctx context.Context, id int64, from string) (store.Pipeline, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return store.Pipeline{}, err
	}
	defer db.mu.Unlock()
	p := db.pipeline(id)
	if p == nil {
		return store.Pipeline{}, pipelineNotFound(id)
	}
	names, err := store.RetryPlan(db.pipelineView(p), from)
	if err != nil {
		return store.Pipeline{}, err
	}
	db.createSteps(p, store.RetrySteps(db.pipelineView(p), names), moveDetails{}, db.now())
	return db.pipelineView(p), nil
}
