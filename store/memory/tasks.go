package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// taskRecord is one row of the tasks table with its audit trail.
type taskRecord struct {
	task.Task
	events []task.Event

	// A pipeline step's dependencies, and how many of them have not ended.
	deps     []depLink
	depsLeft int
}

// fireKey names one tick of one schedule.
type fireKey struct {
	schedule     string
	scheduledFor time.Time
}

// snapshot returns a copy the caller may change freely: the byte slices are
// copied too, since a json.RawMessage shares its array.
func (rec *taskRecord) snapshot() *task.Task {
	t := rec.Task
	t.Payload = bytes.Clone(t.Payload)
	t.Result = bytes.Clone(t.Result)
	t.Progress = bytes.Clone(t.Progress)
	t.Resources = maps.Clone(t.Resources)
	t.Metadata = maps.Clone(t.Metadata)
	return &t
}

// CreateTasks inserts the tasks all or none, and announces the buckets of
// those that can be claimed at once.
func (s *Store) CreateTasks(ctx context.Context, tasks []store.NewTask) ([]*task.Task, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()

	if err := db.checkNewTasks(tasks); err != nil {
		return nil, err
	}
	now := db.now()
	out := make([]*task.Task, len(tasks))
	var due []int
	for i, nt := range tasks {
		rec := db.insertTask(nt, now)
		if rec.Status == task.Queued {
			due = append(due, rec.Bucket)
		}
		out[i] = rec.snapshot()
	}
	db.announceTasks(due...)
	return out, nil
}

// checkNewTasks refuses the whole batch if one task is invalid
// (store.CheckNewTasks) or collides with a unique constraint, either with
// stored tasks or within the batch. The error names the task by its index in
// the batch.
func (db *database) checkNewTasks(tasks []store.NewTask) error {
	if err := store.CheckNewTasks(tasks, db.fleet.NumBuckets); err != nil {
		return err
	}
	ticksInBatch := map[fireKey]int{}
	for i, nt := range tasks {
		if nt.Schedule == "" {
			continue
		}
		tick := fireKey{nt.Schedule, dbTime(nt.ScheduledFor)}
		if j, taken := ticksInBatch[tick]; taken {
			return fmt.Errorf("task at index %d: %w: schedule %q tick %s is also fired by the task at index %d",
				i, store.ErrDuplicate, nt.Schedule, tick.scheduledFor.Format(time.RFC3339Nano), j)
		}
		ticksInBatch[tick] = i
	}
	taken := func(nt store.NewTask) (int64, error) {
		if id, ok := db.uniqueKeys[nt.UniqueKey]; ok && nt.UniqueKey != "" {
			return id, nil
		}
		if id, ok := db.fired[fireKey{nt.Schedule, dbTime(nt.ScheduledFor)}]; ok && nt.Schedule != "" {
			return id, nil
		}
		return 0, nil
	}
	for _, nt := range tasks {
		if id, _ := taken(nt); id > 0 {
			return store.FindDuplicate(tasks, 0, len(tasks), taken)
		}
	}
	return nil
}

// checkJSON refuses a document that is not JSON. Nil or empty stands for
// null and is accepted.
func checkJSON(what string, doc json.RawMessage) error {
	if len(doc) > 0 && !json.Valid(doc) {
		return fmt.Errorf("%w: the %s is not valid JSON", store.ErrInvalid, what)
	}
	return nil
}

// jsonOrNull copies doc, turning "no document" into JSON null as a NOT NULL
// jsonb column with a null default would, so that readers can always
// unmarshal it.
func jsonOrNull(doc json.RawMessage) json.RawMessage {
	if len(doc) == 0 {
		return json.RawMessage("null")
	}
	return bytes.Clone(doc)
}

// insertTask stores one checked task with its creation event.
func (db *database) insertTask(nt store.NewTask, now time.Time) *taskRecord {
	runAt := dbTime(nt.RunAt)
	if runAt.IsZero() {
		runAt = dbTime(now.Add(nt.Delay))
	}
	status := task.Queued
	switch {
	case nt.Pending:
		status = task.Pending
	case runAt.After(now):
		status = task.Scheduled
	}
	maxAttempts := nt.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = store.DefaultMaxAttempts
	}
	rec := &taskRecord{Task: task.Task{
		ID:            int64(len(db.tasks) + 1),
		Kind:          nt.Kind,
		Key:           nt.Key,
		Bucket:        nt.Bucket,
		Status:        status,
		StatusVersion: 1,
		Priority:      nt.Priority,
		RunAt:         runAt,
		MaxAttempts:   maxAttempts,
		Timeout:       nt.Timeout,
		Payload:       jsonOrNull(nt.Payload),
		UniqueKey:     nt.UniqueKey,
		LimitKey:      nt.LimitKey,
		Resources:     maps.Clone(nt.Resources),
		Metadata:      store.NoEmptyMetadata(nt.Metadata),
		Schedule:      nt.Schedule,
		ScheduledFor:  dbTime(nt.ScheduledFor),
		CreatedAt:     now,
		UpdatedAt:     now,
	}}
	rec.events = []task.Event{{TaskID: rec.ID, Seq: 1, To: status, At: now, Reason: "created"}}
	db.tasks = append(db.tasks, rec)
	db.unfinished[rec.ID] = rec
	if rec.UniqueKey != "" {
		db.uniqueKeys[rec.UniqueKey] = rec.ID
	}
	if rec.Schedule != "" {
		db.fired[fireKey{rec.Schedule, rec.ScheduledFor}] = rec.ID
	}
	return rec
}

// task finds a task by id, or nil.
func (db *database) task(id int64) *taskRecord {
	if id < 1 || id > int64(len(db.tasks)) {
		return nil
	}
	return db.tasks[id-1]
}

func taskNotFound(id int64) error {
	return fmt.Errorf("task %d: %w", id, store.ErrNotFound)
}

// GetTask reads one task.
func (s *Store) GetTask(ctx context.Context, id int64) (*task.Task, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	rec := db.task(id)
	if rec == nil {
		return nil, taskNotFound(id)
	}
	return rec.snapshot(), nil
}

// defaultListLimit is the page size of ListTasks when the filter names none.
const defaultListLimit = 100

// ListTasks returns matching tasks, newest first.
func (s *Store) ListTasks(ctx context.Context, f store.TaskFilter) ([]*task.Task, error) {
	for _, st := range f.Statuses {
		if !st.Valid() {
			return nil, fmt.Errorf("%w: unknown task status %q", store.ErrInvalid, st)
		}
	}
	want, err := store.ParsePayloadFilter(f.Payload)
	if err != nil {
		return nil, err
	}
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()

	limit := limitOr(f.Limit, defaultListLimit)
	newest := int64(len(db.tasks))
	if f.BeforeID > 0 {
		newest = min(newest, f.BeforeID-1)
	}
	out := []*task.Task{}
	for id := newest; id >= 1 && len(out) < limit; id-- {
		if rec := db.tasks[id-1]; rec != nil && matches(&rec.Task, f) && (f.Payload == nil || store.PayloadContains(rec.Payload, want)) {
			out = append(out, rec.snapshot())
		}
	}
	return out, nil
}

// matches reports whether t passes every field of f that is set.
func matches(t *task.Task, f store.TaskFilter) bool {
	if len(f.Statuses) > 0 && !containsStatus(f.Statuses, t.Status) {
		return false
	}
	return (f.Buckets == nil || f.Buckets.Contains(t.Bucket)) &&
		(f.Kind == "" || f.Kind == t.Kind) &&
		(f.Key == "" || f.Key == t.Key) &&
		(f.Schedule == "" || f.Schedule == t.Schedule) &&
		(f.Node == "" || f.Node == t.Node)
}

func containsStatus(list []task.Status, s task.Status) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TaskEvents returns a task's audit trail, creation first.
func (s *Store) TaskEvents(ctx context.Context, id int64) ([]task.Event, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	rec := db.task(id)
	if rec == nil {
		return nil, taskNotFound(id)
	}
	return append([]task.Event(nil), rec.events...), nil
}

// Transition moves one task by compare-and-set on its status_version.
func (s *Store) Transition(ctx context.Context, tr store.Transition) (*task.Task, error) {
	if !tr.To.Valid() {
		return nil, fmt.Errorf("%w: unknown task status %q", store.ErrInvalid, tr.To)
	}
	if tr.To == task.Running {
		// Running carries a task lease, claim_seq and epoch, which only a
		// claim hands out.
		return nil, fmt.Errorf("%w: task %d: only a claim moves a task to running", store.ErrInvalid, tr.ID)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()

	rec := db.task(tr.ID)
	if rec == nil {
		return nil, taskNotFound(tr.ID)
	}
	now := db.now()
	if rec.StatusVersion != tr.Version {
		return nil, fmt.Errorf("task %d is at status version %d (%s), not %d: %w",
			rec.ID, rec.StatusVersion, rec.Status, tr.Version, store.ErrConflict)
	}
	if tr.NoWait && db.locked[rec.ID] > 0 {
		return nil, fmt.Errorf("task %d: %w", rec.ID, store.ErrBusy)
	}
	if g := tr.Guard; g != nil && !db.leases[rec.Bucket].liveFor(g.Owner, g.Epoch, now) {
		return nil, fmt.Errorf("task %d: %s does not hold bucket %d under epoch %d: %w",
			rec.ID, g.Owner, rec.Bucket, g.Epoch, store.ErrFenced)
	}
	to, err := db.destination(rec, tr.To)
	if err != nil {
		return nil, err
	}
	db.move(rec, to, moveDetails{
		reason: tr.Reason, errText: tr.Error, node: tr.Node, epoch: tr.Epoch, delay: tr.Delay,
	}, now)
	return rec.snapshot(), nil
}

// destination decides where a requested move out of rec's state goes,
// reading the pending requests from the task itself, as the PostgreSQL
// store reads them from the locked row (task.Destination), and sending a
// resumed step that still waits for dependencies back to pending
// (task.ResumeDestination).
func (db *database) destination(rec *taskRecord, to task.Status) (task.Status, error) {
	return task.Destination(&rec.Task, task.ResumeDestination(rec.Status, to, rec.depsLeft))
}

// moveDetails is what a transition records besides its destination.
type moveDetails struct {
	reason  string
	errText string
	node    string        // for the event
	epoch   int64         // for the event
	delay   time.Duration // from now, for retrying and scheduled
}

// move applies a transition the caller has already allowed, and writes its
// audit event. Claims set their lease fields before calling it.
func (db *database) move(rec *taskRecord, to task.Status, m moveDetails, now time.Time) {
	from := rec.Status
	if task.ApplyMove(&rec.Task, to, m.errText, now, dbTime(now.Add(m.delay))) {
		db.announceTasks(rec.Bucket)
	}
	if from.Active() && !to.Active() || to.Terminal() {
		db.ackLeft(rec.ID, to, m.node, now)
	}
	if to.Terminal() {
		rec.FinishedAt = now
		delete(db.unfinished, rec.ID)
		if rec.UniqueKey != "" && db.uniqueKeys[rec.UniqueKey] == rec.ID {
			delete(db.uniqueKeys, rec.UniqueKey)
		}
	}
	rec.Status = to
	rec.StatusVersion++
	rec.UpdatedAt = now
	rec.events = append(rec.events, task.Event{
		TaskID:  rec.ID,
		Seq:     rec.StatusVersion,
		From:    from,
		To:      to,
		At:      now,
		Node:    m.node,
		Epoch:   m.epoch,
		Attempt: rec.Attempt,
		Reason:  m.reason,
		Error:   m.errText,
	})
	if to.Terminal() && rec.Pipeline != 0 {
		// In the same step as the move, as the PostgreSQL store does it in
		// the same statement: release or skip the steps that wait for it.
		db.resolveDependents(rec, m, now)
	}
}

// announceTasks tells listeners that tasks became claimable in buckets.
func (db *database) announceTasks(buckets ...int) {
	if len(buckets) > 0 {
		db.publish(store.TopicTasks, bucket.Of(buckets...).String())
	}
}
