package benchmark

import (
	"context"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// Kind is the kind of the tasks the bulk insert and the burn-down use: the
// stock no-op (kinds.Noop).
const Kind = "noop"

// DefaultInsertBatch is the number of tasks per CreateTasks call of a bulk
// insert: COPY from 100 on (store/postgres), and the batch River's
// InsertMany and InsertManyFast are compared with.
const DefaultInsertBatch = 1000

// InsertResult is the outcome of a bulk insert.
type InsertResult struct {
	Jobs    int
	Batch   int
	Elapsed time.Duration
}

// JobsPerSecond is the insert rate.
func (r InsertResult) JobsPerSecond() float64 { return PerSecond(r.Jobs, r.Elapsed) }

// Insert creates jobs no-op tasks in batches of batch (DefaultInsertBatch
// when zero), one CreateTasks call each, spread evenly over the fleet's
// buckets. progress, when not nil, is called after each batch with the
// number created so far.
func Insert(ctx context.Context, s Store, jobs, batch int, progress func(done int)) (InsertResult, error) {
	if jobs <= 0 {
		return InsertResult{}, fmt.Errorf("insert: %d jobs; give at least 1", jobs)
	}
	if batch <= 0 {
		batch = DefaultInsertBatch
	}
	meta, err := s.Meta(ctx)
	if err != nil {
		return InsertResult{}, err
	}
	buf := make([]store.NewTask, batch)
	start := time.Now()
	for done := 0; done < jobs; {
		k := min(batch, jobs-done)
		for i := range k {
			buf[i] = store.NewTask{Kind: Kind, Bucket: (done + i) % meta.NumBuckets}
		}
		if _, err := s.CreateTasks(ctx, buf[:k]); err != nil {
			return InsertResult{}, fmt.Errorf("insert: after %d of %d tasks: %w", done, jobs, err)
		}
		done += k
		if progress != nil {
			progress(done)
		}
	}
	return InsertResult{Jobs: jobs, Batch: batch, Elapsed: time.Since(start)}, nil
}

// Analyze refreshes the planner's statistics of the task table, as a
// benchmark does after loading its backlog and before the clock starts. On
// SQLite it does nothing: the store's queries name their indexes' order and
// do not depend on statistics.
func Analyze(ctx context.Context, s Store) error {
	pg, ok := s.(*postgres.Store)
	if !ok {
		return nil
	}
	if _, err := pg.Pool().Exec(ctx, `ANALYZE flotilla_tasks`); err != nil {
		return fmt.Errorf("analyze the task table: %w", err)
	}
	return nil
}
