package benchmark_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// The history measurement runs on a scaled clock: every step is one hour of
// a day-long retention, so that five days of steady load (120 steps) fit in
// well under a minute per variant. Only the rows' timestamps follow that
// clock; the statements' times are the server's real ones.
const (
	historyStep       = time.Hour
	historyRetention  = 24 * time.Hour
	historySteps      = 5 * 24
	historyTasksAStep = 1500 // tasks finished each step: 36,000 a scaled day
	historyPruneBatch = 1000 // tasks a DELETE removes, as the product's default batch
	historySampleStep = 12   // steps between samples
	historyClaimBatch = 100  // tasks a claim takes: a node's default concurrency
	historyBuckets    = 64   // the tasks' buckets, each pruned apart
)

// Autovacuum is off on every scratch table: it runs on the wall clock, and
// five scaled days pass in seconds, so whether it got a turn would be
// chance. The variants bound it instead: no vacuum at all (an autovacuum
// that falls behind), and a plain VACUUM after every scaled hour's prune
// (one that keeps up), timed apart.

// historyStart is the scaled clock's origin, at midnight so that the daily
// partitions' bounds fall on steps.
var historyStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// eventsDeleteDDL is an insert-only event table like flotilla_task_events,
// pruned by task: the batched DELETE of today's retention.
const eventsDeleteDDL = `CREATE TABLE scratch_events (
    task_id bigint NOT NULL, seq bigint NOT NULL,
    from_status text NOT NULL, to_status text NOT NULL, at timestamptz NOT NULL,
    node text NOT NULL DEFAULT '', epoch bigint NOT NULL DEFAULT 0, attempt int NOT NULL DEFAULT 0,
    reason text NOT NULL DEFAULT '', error text NOT NULL DEFAULT '',
    PRIMARY KEY (task_id, seq)) WITH (autovacuum_enabled = false)`

// eventsPartitionedDDL is the same events in a table partitioned by their
// task's finish time. A partitioned table's primary key must hold the
// partition key, so finished_at joins it: uniqueness of (task_id, seq) alone
// could no longer be enforced by the database.
const eventsPartitionedDDL = `CREATE TABLE scratch_events (
    task_id bigint NOT NULL, seq bigint NOT NULL,
    from_status text NOT NULL, to_status text NOT NULL, at timestamptz NOT NULL,
    node text NOT NULL DEFAULT '', epoch bigint NOT NULL DEFAULT 0, attempt int NOT NULL DEFAULT 0,
    reason text NOT NULL DEFAULT '', error text NOT NULL DEFAULT '',
    finished_at timestamptz NOT NULL,
    PRIMARY KEY (task_id, seq, finished_at)) PARTITION BY RANGE (finished_at)`

// insertEventsSQL writes the three events of tasks $1..$2, finished at $3;
// $4 is true when the table carries finished_at.
const insertEventsSQL = `INSERT INTO scratch_events (task_id, seq, from_status, to_status, at, node, epoch, attempt %s)
SELECT t, s, (ARRAY['', 'queued', 'running'])[s], (ARRAY['queued', 'running', 'succeeded'])[s],
       $3::timestamptz - (3 - s) * interval '1 second', 'node-1', 1, 1 %s
FROM generate_series($1::bigint, $2::bigint) t, generate_series(1, 3) s`

// deleteEventsSQL deletes the events of tasks $1..$2 as the product's prune
// does: an index lookup per task id of the batch.
const deleteEventsSQL = `DELETE FROM scratch_events e
WHERE e.task_id = ANY(ARRAY(SELECT generate_series($1::bigint, $2::bigint)))`

// historySample is one reading of a history variant.
type historySample struct {
	hours        int
	bytes        int64 // the table (every partition) with its indexes
	rows, dead   int64
	claimPerTask time.Duration // task variants only
	// historyBytes is the task history table's, every partition with its
	// indexes: task variants only, 0 unless finished tasks are moved.
	historyBytes int64
}

// historyResult is a whole run of one variant.
type historyResult struct {
	samples []historySample
	// pruneTimes are the wall times of each step's retention work: every
	// DELETE batch of the step together, or the DROP of a partition.
	pruneTimes []time.Duration
	insertTime time.Duration // every insert (or move) of finished rows
	// vacuumTimes are the VACUUMs after each step's prune, in the
	// variants that run one.
	vacuumTimes []time.Duration
}

// vacuum runs a plain VACUUM of table, timed into r. The connection's own
// counts of deleted rows are flushed first: flushed after the VACUUM, they
// would be added to the dead rows it has just reset.
func vacuum(ctx context.Context, conn *pgx.Conn, table string, r *historyResult) error {
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := conn.Exec(ctx, `VACUUM `+table); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	r.vacuumTimes = append(r.vacuumTimes, time.Since(t0))
	return nil
}

// BenchmarkHistoryEvents compares two ways of keeping a day of task events
// under the same steady load (36,000 tasks, 108,000 events a scaled day, five
// days): today's batched DELETE by task id, with no vacuum and with a VACUUM
// after each step's prune (an autovacuum that keeps up),
// against a table range-partitioned by the tasks' finish time, one
// partition a day, dropped whole once past the retention age. Scratch tables
// in a database of their own; nothing of the product's schema is used.
//
//	go test -run '^$' -bench HistoryEvents -benchtime 1x -count 3 -v ./benchmark/
func BenchmarkHistoryEvents(b *testing.B) {
	for _, v := range []string{"delete", "delete/vacuum=each_step", "partitions"} {
		b.Run("prune="+v, func(b *testing.B) {
			for range b.N {
				conn := scratchConn(b)
				r, err := runHistoryEvents(context.Background(), conn, v)
				if err != nil {
					b.Fatal(err)
				}
				reportHistory(b, r)
			}
		})
	}
}

// BenchmarkHistoryTasks asks what moving finished tasks out of the hot task
// table changes for it, at the same steady rate: tasks are inserted queued,
// claimed in batches through a partial claim index and completed; then
// either they stay, finished, and a batched DELETE removes them past the
// retention age (today), or the completion moves each into a history table
// partitioned by day, whose old partitions are dropped. The move is itself a
// delete from the hot table: it leaves a dead row per task at once, where
// the prune leaves it a day later. Reported: the hot table's size and dead
// rows, the history table's size, the claim's time per task, and the
// retention work's time.
//
//	go test -run '^$' -bench HistoryTasks -benchtime 1x -count 3 -v ./benchmark/
func BenchmarkHistoryTasks(b *testing.B) {
	for _, v := range []string{"delete", "delete/vacuum=each_step", "move", "move/vacuum=each_step"} {
		b.Run("finished="+v, func(b *testing.B) {
			for range b.N {
				conn := scratchConn(b)
				r, err := runHistoryTasks(context.Background(), conn, v)
				if err != nil {
					b.Fatal(err)
				}
				reportHistory(b, r)
				b.ReportMetric(float64(median(claimTimes(r)).Nanoseconds())/1000, "claim-us/task")
				b.ReportMetric(mb(r.samples[len(r.samples)-1].historyBytes), "history-MB")
			}
		})
	}
}

// scratchConn is one connection to a fresh database, dropped with the test:
// one connection so that the statistics it reads are its own, flushed.
func scratchConn(tb testing.TB) *pgx.Conn {
	tb.Helper()
	if testing.Short() {
		tb.Skip("needs PostgreSQL; skipped by -short")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.New(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	return conn
}

func runHistoryEvents(ctx context.Context, conn *pgx.Conn, variant string) (historyResult, error) {
	partitioned := variant == "partitions"
	ddl, extraCol, extraVal := eventsDeleteDDL, "", ""
	if partitioned {
		ddl, extraCol, extraVal = eventsPartitionedDDL, ", finished_at", ", $3::timestamptz"
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		return historyResult{}, err
	}
	insert := fmt.Sprintf(insertEventsSQL, extraCol, extraVal)
	parts := newDailyPartitions("scratch_events")
	var r historyResult
	var pruned int64 // tasks below this id are gone: ids follow finish time
	for step := 1; step <= historySteps; step++ {
		now := historyStart.Add(time.Duration(step) * historyStep)
		var upkeep time.Duration // making partitions ahead is retention's work too
		if partitioned {
			t0 := time.Now()
			if err := parts.ensure(ctx, conn, now); err != nil {
				return r, err
			}
			upkeep = time.Since(t0)
		}
		first := int64(step-1)*historyTasksAStep + 1
		t0 := time.Now()
		if _, err := conn.Exec(ctx, insert, first, first+historyTasksAStep-1, now); err != nil {
			return r, fmt.Errorf("insert: %w", err)
		}
		r.insertTime += time.Since(t0)

		// The retention pass: tasks finished at or before the cutoff go.
		cutoff := now.Add(-historyRetention)
		t0 = time.Now()
		if partitioned {
			if err := parts.dropBefore(ctx, conn, cutoff); err != nil {
				return r, err
			}
		} else {
			last := taskOfStep(cutoff) // the last task finished by the cutoff
			for pruned < last {
				next := min(pruned+historyPruneBatch, last)
				if _, err := conn.Exec(ctx, deleteEventsSQL, pruned+1, next); err != nil {
					return r, fmt.Errorf("prune: %w", err)
				}
				pruned = next
			}
		}
		r.pruneTimes = append(r.pruneTimes, upkeep+time.Since(t0))
		if strings.HasSuffix(variant, "/vacuum=each_step") {
			if err := vacuum(ctx, conn, "scratch_events", &r); err != nil {
				return r, err
			}
		}
		if step%historySampleStep == 0 {
			sm, err := sampleTables(ctx, conn, "scratch_events")
			if err != nil {
				return r, err
			}
			sm.hours = step
			r.samples = append(r.samples, sm)
		}
	}
	return r, nil
}

// taskOfStep is the last task id finished at or before t on the scaled
// clock.
func taskOfStep(t time.Time) int64 {
	steps := int64(t.Sub(historyStart) / historyStep)
	return max(steps, 0) * historyTasksAStep
}

// The hot task table, its claim and its completion as the product's
// (migrations 0001, 0005 and 0006: the same fillfactor, claim index and
// finished index) with fewer columns: the rows are narrower than
// flotilla_tasks', so sizes compare between variants, not with the product.
const (
	hotTasksDDL = `CREATE TABLE scratch_tasks (
    id bigserial PRIMARY KEY, kind text NOT NULL, bucket int NOT NULL, status text NOT NULL,
    priority int NOT NULL DEFAULT 0, run_at timestamptz NOT NULL, payload jsonb NOT NULL DEFAULT '{}',
    attempt int NOT NULL DEFAULT 0, node text NOT NULL DEFAULT '', finished_at timestamptz,
    created_at timestamptz NOT NULL) WITH (fillfactor = 90, autovacuum_enabled = false)`
	hotClaimIndexDDL = `CREATE INDEX scratch_tasks_claim_idx ON scratch_tasks (priority DESC, run_at, id, bucket)
    WHERE status IN ('queued', 'scheduled', 'retrying')`
	hotFinishedIndexDDL = `CREATE INDEX scratch_tasks_finished_idx ON scratch_tasks (bucket, status, finished_at)
    WHERE status IN ('succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost', 'skipped')`
	historyTasksDDL = `CREATE TABLE scratch_task_history (
    id bigint NOT NULL, kind text NOT NULL, bucket int NOT NULL, status text NOT NULL,
    priority int NOT NULL, run_at timestamptz NOT NULL, payload jsonb NOT NULL,
    attempt int NOT NULL, node text NOT NULL, finished_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL, PRIMARY KEY (id, finished_at)) PARTITION BY RANGE (finished_at)`

	hotInsertSQL = `INSERT INTO scratch_tasks (kind, bucket, status, run_at, payload, created_at)
SELECT 'noop', g % $3::int, 'queued', $2::timestamptz, '{"n": 1}', $2::timestamptz FROM generate_series(1, $1::int) g`
	hotClaimSQL = `UPDATE scratch_tasks t SET status = 'running', attempt = t.attempt + 1, node = 'node-1'
WHERE t.id = ANY(ARRAY(
    SELECT c.id FROM scratch_tasks c WHERE c.status IN ('queued', 'scheduled', 'retrying') AND c.run_at <= $1::timestamptz
    ORDER BY c.priority DESC, c.run_at, c.id LIMIT $2::int FOR UPDATE SKIP LOCKED))
RETURNING t.id`
	hotCompleteSQL = `UPDATE scratch_tasks SET status = 'succeeded', finished_at = $2::timestamptz WHERE id = ANY($1::bigint[])`
	hotMoveSQL     = `WITH moved AS (DELETE FROM scratch_tasks WHERE id = ANY($1::bigint[]) RETURNING *)
INSERT INTO scratch_task_history (id, kind, bucket, status, priority, run_at, payload, attempt, node, finished_at, created_at)
SELECT id, kind, bucket, 'succeeded', priority, run_at, payload, attempt, node, $2::timestamptz, created_at FROM moved`
	// hotPruneSQL is the product's prune of bucket $3 reduced to the task
	// rows: a walk of the finished index from the oldest end, at most $2.
	hotPruneSQL = `DELETE FROM scratch_tasks t WHERE t.id = ANY(ARRAY(
    SELECT f.id FROM scratch_tasks f
    WHERE f.bucket = $3::int AND f.status = 'succeeded' AND f.finished_at <= $1::timestamptz
      AND f.status IN ('succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost', 'skipped')
    ORDER BY f.finished_at LIMIT $2::int FOR UPDATE SKIP LOCKED))`
)

func runHistoryTasks(ctx context.Context, conn *pgx.Conn, variant string) (historyResult, error) {
	move := strings.HasPrefix(variant, "move")
	for _, ddl := range []string{hotTasksDDL, hotClaimIndexDDL, hotFinishedIndexDDL, historyTasksDDL} {
		if _, err := conn.Exec(ctx, ddl); err != nil {
			return historyResult{}, err
		}
	}
	parts := newDailyPartitions("scratch_task_history")
	var r historyResult
	var claimTime time.Duration
	var claimed int
	for step := 1; step <= historySteps; step++ {
		now := historyStart.Add(time.Duration(step) * historyStep)
		var upkeep time.Duration // making partitions ahead is retention's work too
		if move {
			t0 := time.Now()
			if err := parts.ensure(ctx, conn, now); err != nil {
				return r, err
			}
			upkeep = time.Since(t0)
		}
		if _, err := conn.Exec(ctx, hotInsertSQL, historyTasksAStep, now, historyBuckets); err != nil {
			return r, fmt.Errorf("insert: %w", err)
		}
		for left := historyTasksAStep; left > 0; {
			t0 := time.Now()
			rows, err := conn.Query(ctx, hotClaimSQL, now, historyClaimBatch)
			if err != nil {
				return r, fmt.Errorf("claim: %w", err)
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return r, fmt.Errorf("claim: %w", err)
			}
			claimTime += time.Since(t0)
			claimed += len(ids)
			if len(ids) == 0 {
				return r, fmt.Errorf("step %d: claim found nothing with %d tasks left", step, left)
			}
			left -= len(ids)
			complete := hotCompleteSQL
			if move {
				complete = hotMoveSQL
			}
			t0 = time.Now()
			if _, err := conn.Exec(ctx, complete, ids, now); err != nil {
				return r, fmt.Errorf("complete: %w", err)
			}
			r.insertTime += time.Since(t0)
		}

		cutoff := now.Add(-historyRetention)
		t0 := time.Now()
		if move {
			if err := parts.dropBefore(ctx, conn, cutoff); err != nil {
				return r, err
			}
		} else {
			// Bucket by bucket, as each holder prunes its own.
			for bucket := range historyBuckets {
				for {
					tag, err := conn.Exec(ctx, hotPruneSQL, cutoff, historyPruneBatch, bucket)
					if err != nil {
						return r, fmt.Errorf("prune: %w", err)
					}
					if tag.RowsAffected() < historyPruneBatch {
						break
					}
				}
			}
		}
		r.pruneTimes = append(r.pruneTimes, upkeep+time.Since(t0))
		if strings.HasSuffix(variant, "/vacuum=each_step") {
			if err := vacuum(ctx, conn, "scratch_tasks", &r); err != nil {
				return r, err
			}
		}
		if step%historySampleStep == 0 {
			sm, err := sampleTables(ctx, conn, "scratch_tasks")
			if err != nil {
				return r, err
			}
			hist, err := sampleTables(ctx, conn, "scratch_task_history")
			if err != nil {
				return r, err
			}
			sm.hours, sm.historyBytes = step, hist.bytes
			sm.claimPerTask = claimTime / time.Duration(max(claimed, 1))
			claimTime, claimed = 0, 0
			r.samples = append(r.samples, sm)
		}
	}
	return r, nil
}

// dailyPartitions keeps one partition a scaled day of a table partitioned
// by range on finished_at: the next day's is made ahead, and a day's is
// dropped once its whole range is past the retention cutoff.
type dailyPartitions struct {
	parent string
	days   []time.Time // the first instant of each partition present, in order
}

func newDailyPartitions(parent string) *dailyPartitions { return &dailyPartitions{parent: parent} }

func (p *dailyPartitions) name(day time.Time) string {
	return p.parent + "_" + day.Format("20060102")
}

// ensure creates the partitions of now's day and the next, so that no insert
// ever finds no partition.
func (p *dailyPartitions) ensure(ctx context.Context, conn *pgx.Conn, now time.Time) error {
	today := now.Truncate(24 * time.Hour)
	for _, day := range []time.Time{today, today.Add(24 * time.Hour)} {
		if slices.ContainsFunc(p.days, day.Equal) {
			continue
		}
		sql := fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s') WITH (autovacuum_enabled = false)`,
			p.name(day), p.parent, day.Format(time.RFC3339), day.Add(24*time.Hour).Format(time.RFC3339))
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("partition: %w", err)
		}
		p.days = append(p.days, day)
	}
	return nil
}

// dropBefore drops every partition whose range ends at or before cutoff.
// A row finished exactly at a day's end belongs to the next day's partition
// (ranges are inclusive below, exclusive above), so a partition goes only
// when all its rows are past the retention age: rows live a day to two.
func (p *dailyPartitions) dropBefore(ctx context.Context, conn *pgx.Conn, cutoff time.Time) error {
	for len(p.days) > 0 && !p.days[0].Add(24*time.Hour).After(cutoff) {
		if _, err := conn.Exec(ctx, `DROP TABLE `+p.name(p.days[0])); err != nil {
			return fmt.Errorf("drop partition: %w", err)
		}
		p.days = p.days[1:]
	}
	return nil
}

// sampleTables reads the size, live and dead rows of a table, summed over
// its partitions when it has some, after flushing this connection's
// statistics so that they count its own last statements; then it analyzes
// the table.
func sampleTables(ctx context.Context, conn *pgx.Conn, table string) (historySample, error) {
	var sm historySample
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		return sm, err
	}
	err := conn.QueryRow(ctx, `
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint,
       coalesce(sum(s.n_live_tup), 0)::bigint, coalesce(sum(s.n_dead_tup), 0)::bigint
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND (c.relname = $1::text OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::text::regclass))`,
		table).Scan(&sm.bytes, &sm.rows, &sm.dead)
	if err != nil {
		return sm, err
	}
	// With autovacuum off nothing else gathers the planner's statistics.
	// After the reading: ANALYZE replaces the row counts with estimates.
	_, err = conn.Exec(ctx, `ANALYZE `+table)
	return sm, err
}

// reportHistory logs a run's samples as CSV and reports its final size and
// dead rows, the median and worst retention step, and the insert time.
func reportHistory(b *testing.B, r historyResult) {
	var csv strings.Builder
	csv.WriteString("\nscaled_hours,mb,live_rows,dead_rows,claim_us_per_task,history_mb\n")
	for _, s := range r.samples {
		fmt.Fprintf(&csv, "%d,%.1f,%d,%d,%.1f,%.1f\n", s.hours, mb(s.bytes), s.rows, s.dead,
			float64(s.claimPerTask.Nanoseconds())/1000, mb(s.historyBytes))
	}
	b.Log(csv.String())
	last := r.samples[len(r.samples)-1]
	b.ReportMetric(mb(last.bytes), "final-MB")
	b.ReportMetric(float64(last.dead), "final-dead-rows")
	// The steady state: the last three scaled days, once retention prunes.
	steady := r.pruneTimes[len(r.pruneTimes)-3*24:]
	var total time.Duration
	for _, d := range steady {
		total += d
	}
	b.ReportMetric(float64(total.Microseconds())/1000/3, "prune-ms/day")
	b.ReportMetric(float64(slices.Max(steady).Microseconds())/1000, "prune-max-ms")
	b.ReportMetric(float64(r.insertTime.Microseconds())/1000/historySteps, "write-ms/step")
	if len(r.vacuumTimes) > 0 {
		var vac time.Duration
		for _, d := range r.vacuumTimes[len(r.vacuumTimes)-3*24:] {
			vac += d
		}
		b.ReportMetric(float64(vac.Microseconds())/1000/3, "vacuum-ms/day")
	}
}

// claimTimes are the claim's time per task at each sample past the first
// scaled day, once the table has reached its steady size.
func claimTimes(r historyResult) []time.Duration {
	var out []time.Duration
	for _, s := range r.samples {
		if s.hours > 24 {
			out = append(out, s.claimPerTask)
		}
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func TestDailyPartitionsAreMadeAheadAndDroppedOnlyWhollyPastTheCutoff(t *testing.T) {
	ctx := context.Background()
	conn := scratchConn(t)
	if _, err := conn.Exec(ctx, eventsPartitionedDDL); err != nil {
		t.Fatal(err)
	}
	parts := newDailyPartitions("scratch_events")
	present := func() []string {
		rows, err := conn.Query(ctx, `SELECT inhrelid::regclass::text FROM pg_inherits
			WHERE inhparent = 'scratch_events'::regclass ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	day := func(n int) time.Time { return historyStart.Add(time.Duration(n) * 24 * time.Hour) }
	for _, now := range []time.Time{day(0).Add(time.Hour), day(1).Add(23 * time.Hour)} {
		if err := parts.ensure(ctx, conn, now); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"scratch_events_20260101", "scratch_events_20260102", "scratch_events_20260103"}
	if got := present(); !slices.Equal(got, want) {
		t.Fatalf("partitions %v, want %v: today's and tomorrow's each time", got, want)
	}
	// A row finished just before midnight of the first day must outlive a
	// cutoff of 23:00 that day: the first day's partition stays.
	if err := parts.dropBefore(ctx, conn, day(0).Add(23*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := present(); !slices.Equal(got, want) {
		t.Errorf("after a cutoff inside the first day: partitions %v, want every one kept", got)
	}
	if err := parts.dropBefore(ctx, conn, day(1)); err != nil {
		t.Fatal(err)
	}
	if got := present(); !slices.Equal(got, want[1:]) {
		t.Errorf("after a cutoff at the first day's end: partitions %v, want %v", got, want[1:])
	}
}

// The dead rows a variant reports after its VACUUM must be the ones the
// VACUUM left, not the connection's own deletes counted after it.
func TestDeadRowsAfterTheStepsVacuumAreTheVacuumsCount(t *testing.T) {
	ctx := context.Background()
	conn := scratchConn(t)
	if _, err := conn.Exec(ctx, eventsDeleteDDL); err != nil {
		t.Fatal(err)
	}
	insert := fmt.Sprintf(insertEventsSQL, "", "")
	if _, err := conn.Exec(ctx, insert, 1, 1000, historyStart); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, deleteEventsSQL, 1, 500); err != nil {
		t.Fatal(err)
	}
	var r historyResult
	if err := vacuum(ctx, conn, "scratch_events", &r); err != nil {
		t.Fatal(err)
	}
	sm, err := sampleTables(ctx, conn, "scratch_events")
	if err != nil {
		t.Fatal(err)
	}
	if sm.dead != 0 || sm.rows != 1500 || len(r.vacuumTimes) != 1 {
		t.Errorf("after deleting 1,500 of 3,000 events and a VACUUM: %d dead, %d live, %d vacuums timed; want 0, 1,500, 1",
			sm.dead, sm.rows, len(r.vacuumTimes))
	}
}
