package memory

import (
	"context"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// consoleTables are what the PostgreSQL store's retry and per-minute count
// tables hold.
type consoleTables struct {
	retried map[int64]store.RetryLink // by the task run again
	retryOf map[int64]int64           // the new task's id to the one it runs again
	minutes map[minuteKey]int
}

type minuteKey struct {
	minute time.Time
	node   string
	kind   string
	status task.Status
}

func (c *consoleTables) init() {
	if c.retried == nil {
		c.retried, c.retryOf, c.minutes = map[int64]store.RetryLink{}, map[int64]int64{}, map[minuteKey]int{}
	}
}

// forget removes the retry links that name a task removed by retention.
func (c *consoleTables) forget(id int64) {
	c.init()
	if l, ok := c.retried[id]; ok {
		delete(c.retried, id)
		delete(c.retryOf, l.RetryID)
	}
	if of, ok := c.retryOf[id]; ok {
		delete(c.retryOf, id)
		delete(c.retried, of)
	}
}

// RetryTask runs a task that ended without success again, as a new task.
func (s *Store) RetryTask(ctx context.Context, req store.RetryRequest) (*task.Task, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	db.console.init()
	rec := db.task(req.ID)
	if rec == nil {
		return nil, taskNotFound(req.ID)
	}
	if err := store.CheckRetry(&rec.Task, db.console.retried[rec.ID].RetryID); err != nil {
		return nil, err
	}
	now := db.now()
	link := func(old, fresh int64, step string) error {
		db.task(fresh).events[0].Reason = store.RetryReason(req, step)
		db.console.retried[old] = store.RetryLink{TaskID: old, RetryID: fresh, By: req.By, At: now}
		db.console.retryOf[fresh] = old
		return nil
	}
	if rec.Pipeline == 0 {
		nt := store.RetryTaskOf(&rec.Task)
		if err := db.checkNewTasks([]store.NewTask{nt}); err != nil {
			return nil, err
		}
		fresh := db.insertTask(nt, now)
		if fresh.Status == task.Queued {
			db.announceTasks(fresh.Bucket)
		}
		_ = link(rec.ID, fresh.ID, "") // it does not fail
		return fresh.snapshot(), nil
	}
	p := db.pipeline(rec.Pipeline)
	if p == nil {
		return nil, pipelineNotFound(rec.Pipeline)
	}
	view := db.pipelineView(p)
	step, err := store.RetryStepOf(view, &rec.Task)
	if err != nil {
		return nil, err
	}
	names, err := store.RetryPlan(view, step)
	if err != nil {
		return nil, err
	}
	db.createSteps(p, store.RetrySteps(view, names), moveDetails{}, now)
	_ = store.LinkRetried(view, db.pipelineView(p), names, link) // link does not fail
	return db.task(p.byName[step].current()).snapshot(), nil
}

// TaskRetries reads a task's retry links.
func (s *Store) TaskRetries(ctx context.Context, id int64) (store.Retries, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return store.Retries{}, err
	}
	defer db.mu.Unlock()
	db.console.init()
	if db.task(id) == nil {
		return store.Retries{}, taskNotFound(id)
	}
	var out store.Retries
	if l, ok := db.console.retried[id]; ok {
		out.As = &l
	}
	if of, ok := db.console.retryOf[id]; ok {
		l := db.console.retried[of]
		out.Of = &l
	}
	return out, nil
}

// ListPipelines lists pipelines newest first with their steps counted.
func (s *Store) ListPipelines(ctx context.Context, f store.PipelineFilter) ([]store.PipelineSummary, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	limit := f.ListLimit()
	newest := int64(len(db.pipelines))
	if f.BeforeID > 0 {
		newest = min(newest, f.BeforeID-1)
	}
	out := []store.PipelineSummary{}
	for id := newest; id >= 1 && len(out) < limit; id-- {
		if p := db.pipeline(id); p != nil {
			out = append(out, store.SummaryOf(db.pipelineView(p)))
		}
	}
	return out, nil
}

// UnfinishedByKind counts the claimable and active tasks by kind and state.
func (s *Store) UnfinishedByKind(ctx context.Context) ([]store.KindCount, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	type key struct {
		kind   string
		status task.Status
	}
	counts := map[key]int{}
	for _, rec := range db.unfinished {
		if rec.Status.Claimable() || rec.Status.Active() {
			counts[key{rec.Kind, rec.Status}]++
		}
	}
	out := make([]store.KindCount, 0, len(counts))
	for k, n := range counts {
		out = append(out, store.KindCount{Kind: k.kind, Status: k.status, Count: n})
	}
	store.SortKindCounts(out)
	return out, nil
}

// AddMinuteCounts adds a node's per-minute counts and forgets old ones.
func (s *Store) AddMinuteCounts(ctx context.Context, node string, counts []store.MinuteCount) error {
	if err := store.CheckMinuteCounts(node, counts); err != nil {
		return err
	}
	db, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer db.mu.Unlock()
	db.console.init()
	for _, c := range counts {
		db.console.minutes[minuteKey{dbTime(c.Minute), node, c.Kind, c.Status}] += c.Count
	}
	oldest := db.now().Add(-store.MinuteCountsKept)
	for k := range db.console.minutes {
		if k.minute.Before(oldest) {
			delete(db.console.minutes, k)
		}
	}
	return nil
}

// MinuteCounts sums every node's counts from since on.
func (s *Store) MinuteCounts(ctx context.Context, since time.Time) ([]store.MinuteCount, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	db.console.init()
	type key struct {
		minute time.Time
		kind   string
		status task.Status
	}
	sums := map[key]int{}
	for k, n := range db.console.minutes {
		if !k.minute.Before(since) {
			sums[key{k.minute, k.kind, k.status}] += n
		}
	}
	out := make([]store.MinuteCount, 0, len(sums))
	for k, n := range sums {
		out = append(out, store.MinuteCount{Minute: k.minute, Kind: k.kind, Status: k.status, Count: n})
	}
	store.SortMinuteCounts(out)
	return out, nil
}
