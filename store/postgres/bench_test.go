package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// BenchmarkClaimComplete measures the per-task cost of the execution hot
// path: claim a batch of 100 no-op tasks, complete them with one
// AdvanceActive. One op is one task. It runs on an otherwise empty table
// and beside 1,000,000 finished tasks, whose presence must not change the
// cost; the workers variants run several claim loops at once, as a node's
// executors would.
//
//	go test -run='^$' -bench=ClaimComplete -benchtime=20000x ./store/postgres/
func BenchmarkClaimComplete(b *testing.B) {
	for _, c := range []struct {
		name     string
		finished int
		workers  int
	}{
		{"empty", 0, 1},
		{"finished_1M", 1_000_000, 1},
		{"empty/4_workers", 0, 4},
		{"finished_1M/4_workers", 1_000_000, 4},
	} {
		b.Run(c.name, func(b *testing.B) { benchClaimComplete(b, c.finished, c.workers) })
	}
}

const benchBatch = 100

func benchClaimComplete(b *testing.B, finished, workers int) {
	ctx := context.Background()
	s := migrated(b, bucket.DefaultCount)
	if finished > 0 {
		fill := fmt.Sprintf(`
			INSERT INTO flotilla_tasks (kind, bucket, status, status_version, run_at, attempt, max_attempts,
			                            claim_seq, node, epoch, created_at, started_at, finished_at, updated_at)
			SELECT 'noop', g %% %d, 'succeeded', 3, now(), 1, 3, 1, 'bench', 1, now(), now(), now(), now()
			FROM generate_series(1, %d) g`, bucket.DefaultCount, finished)
		if _, err := s.Pool().Exec(ctx, fill); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Pool().Exec(ctx, `VACUUM ANALYZE flotilla_tasks`); err != nil {
			b.Fatal(err)
		}
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{
		Owner: "bench", Node: "bench", Buckets: bucket.All(bucket.DefaultCount), TTL: time.Hour,
	})
	if err != nil {
		b.Fatal(err)
	}
	held := make([]store.HeldBucket, len(leases))
	for i, l := range leases {
		held[i] = store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch}
	}
	enqueue(b, s, b.N)

	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := claimAndComplete(ctx, s, held); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	if n := queryValue[int64](b, s, `SELECT count(*) FROM flotilla_tasks WHERE status = 'succeeded'`); n != int64(finished+b.N) {
		b.Fatalf("%d tasks succeeded, want %d", n, finished+b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "tasks/s")
}

// enqueue creates n no-op tasks spread over every bucket.
func enqueue(b *testing.B, s *postgres.Store, n int) {
	ctx := context.Background()
	const chunk = 10_000
	for done := 0; done < n; done += chunk {
		batch := make([]store.NewTask, min(chunk, n-done))
		for i := range batch {
			batch[i] = store.NewTask{Kind: "noop", Bucket: (done + i) % bucket.DefaultCount}
		}
		if _, err := s.CreateTasks(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
}

// claimAndComplete runs one executor loop until the queue is empty.
func claimAndComplete(ctx context.Context, s *postgres.Store, held []store.HeldBucket) error {
	batch := make([]store.ActiveTransition, 0, benchBatch)
	for {
		claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{
			Owner: "bench", Node: "bench", Buckets: held, Kinds: []string{"noop"}, Limit: benchBatch, LeaseTTL: time.Minute,
		})
		if err != nil {
			return err
		}
		if len(claimed) == 0 {
			return nil
		}
		batch = batch[:0]
		for _, t := range claimed {
			batch = append(batch, store.ActiveTransition{Ref: t.Ref(), To: task.Succeeded, Node: "bench"})
		}
		out, err := s.AdvanceActive(ctx, "bench", batch)
		if err != nil {
			return err
		}
		for _, o := range out {
			if o.Err != nil {
				return o.Err
			}
		}
	}
}

// BenchmarkCreateTasks measures inserts per task, by batch size: the
// multi-row INSERT below copyThreshold, COPY from it on.
func BenchmarkCreateTasks(b *testing.B) {
	for _, size := range []int{1, 10, 100, 1000, 10_000} {
		b.Run(fmt.Sprintf("batch_%d", size), func(b *testing.B) {
			ctx := context.Background()
			s := migrated(b, bucket.DefaultCount)
			batch := make([]store.NewTask, size)
			for i := range batch {
				batch[i] = store.NewTask{Kind: "noop", Key: fmt.Sprint(i), Bucket: i % bucket.DefaultCount,
					Payload: []byte(`{"n": 1}`)}
			}
			b.ResetTimer()
			start := time.Now()
			for done := 0; done < b.N; done += size {
				if _, err := s.CreateTasks(ctx, batch[:min(size, b.N-done)]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
		})
	}
}

// BenchmarkClaimBesideFinished measures what one claim of 100 tasks costs
// the database beside 10,000,000 finished tasks, against the same claim on
// a table that has none: the claim walks the claim index, which holds only
// claimable rows, so the ratio must stay near 1. One op is one claim (the
// claimed tasks are left running). The two tables are loaded once and
// measured in alternating rounds, so that both see the same moments of a
// shared machine; before each round the previous round's tasks are
// deleted. server-cpu-us/claim is the CPU time of the database's backends.
//
//	go test -run '^$' -bench ClaimBesideFinished -benchtime 2000x -timeout 30m ./store/postgres/
func BenchmarkClaimBesideFinished(b *testing.B) {
	const finished = 10_000_000
	ctx := context.Background()
	empty := migrated(b, bucket.DefaultCount)
	full := migrated(b, bucket.DefaultCount)
	loadStart := time.Now()
	fill := fmt.Sprintf(`
		INSERT INTO flotilla_tasks (kind, bucket, status, status_version, run_at, attempt, max_attempts,
		                            claim_seq, node, epoch, created_at, started_at, finished_at, updated_at)
		SELECT 'noop', g %% %d, 'succeeded', 3, now(), 1, 3, 1, 'bench', 1, now(), now(), now(), now()
		FROM generate_series(1, %d) g`, bucket.DefaultCount, finished)
	for _, sql := range []string{fill, `VACUUM ANALYZE flotilla_tasks`} {
		if _, err := full.Pool().Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("%d finished tasks loaded in %v", finished, time.Since(loadStart).Round(time.Second))
	for round := range 3 {
		for _, c := range []struct {
			name string
			s    *postgres.Store
		}{{"empty", empty}, {"finished_10M", full}} {
			b.Run(fmt.Sprintf("%s/round_%d", c.name, round+1), func(b *testing.B) { benchClaim(b, c.s) })
		}
	}
}

func benchClaim(b *testing.B, s *postgres.Store) {
	ctx := context.Background()
	for _, sql := range []string{
		`DELETE FROM flotilla_task_events WHERE task_id IN (SELECT id FROM flotilla_tasks WHERE status <> 'succeeded')`,
		`DELETE FROM flotilla_tasks WHERE status <> 'succeeded'`,
		`VACUUM flotilla_tasks`,
	} {
		if _, err := s.Pool().Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{
		Owner: "bench", Node: "bench", Buckets: bucket.All(bucket.DefaultCount), TTL: time.Hour,
	})
	if err != nil {
		b.Fatal(err)
	}
	held := make([]store.HeldBucket, len(leases))
	for i, l := range leases {
		held[i] = store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch}
	}
	enqueue(b, s, b.N*benchBatch)
	if _, err := s.Pool().Exec(ctx, `ANALYZE flotilla_tasks`); err != nil {
		b.Fatal(err)
	}
	before, err := benchmark.ReadBackendCPU(ctx, s.Pool())
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{
			Owner: "bench", Node: "bench", Buckets: held, Kinds: []string{"noop"}, Limit: benchBatch, LeaseTTL: time.Hour,
		})
		if err != nil {
			b.Fatal(err)
		}
		if len(claimed) != benchBatch {
			b.Fatalf("claimed %d tasks, want %d", len(claimed), benchBatch)
		}
	}
	b.StopTimer()
	after, err := benchmark.ReadBackendCPU(ctx, s.Pool())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(after.Since(before).Nanoseconds())/1000/float64(b.N), "server-cpu-us/claim")
}

// BenchmarkPipelineOutcomes measures, statement by statement, what a
// pipeline adds to the outcome writes of its steps, beside plain tasks in
// one bucket (a pipeline's placement):
//
//   - release: the write that ends a fan-out's root and so releases its b.N
//     dependents, in ms per write;
//   - fan-in and plain: the outcome writes of b.N tasks, in batches of 100
//     claimed ones, in µs per task: a fan-in's dependencies (each batch also
//     counts the fan-in down), and plain tasks.
//
// Only the outcome writes are timed; the claims between them are not.
//
//	go test -run='^$' -bench=PipelineOutcomes -benchtime=10000x ./store/postgres/
func BenchmarkPipelineOutcomes(b *testing.B) {
	for _, shape := range []string{"release", "fan-in", "plain"} {
		b.Run(shape, func(b *testing.B) {
			ctx := context.Background()
			s := migrated(b, bucket.DefaultCount)
			p, err := s.CreatePipeline(ctx, fanOutFanIn(b.N))
			if err != nil {
				b.Fatal(err)
			}
			bk := p.Bucket
			leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "bench", Node: "bench", Buckets: bucket.Of(bk), TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			held := []store.HeldBucket{{Bucket: bk, Epoch: leases[0].Epoch}}
			claim := func(kind string) []store.ActiveTransition {
				claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "bench", Node: "bench", Buckets: held,
					Kinds: []string{kind}, Limit: benchBatch, LeaseTTL: time.Hour})
				if err != nil {
					b.Fatal(err)
				}
				batch := make([]store.ActiveTransition, len(claimed))
				for i, t := range claimed {
					batch[i] = store.ActiveTransition{Ref: t.Ref(), To: task.Succeeded, Node: "bench"}
				}
				return batch
			}
			var spent time.Duration
			advance := func(batch []store.ActiveTransition) {
				start := time.Now()
				out, err := s.AdvanceActive(ctx, "bench", batch)
				spent += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				for _, o := range out {
					if o.Err != nil || o.Status != task.Succeeded {
						b.Fatalf("outcome %+v", o)
					}
				}
			}
			b.ResetTimer()
			switch shape {
			case "release":
				advance(claim("root"))
				b.ReportMetric(float64(spent.Microseconds())/1000, "ms/write")
				return
			case "plain":
				nts := make([]store.NewTask, b.N)
				for i := range nts {
					nts[i] = store.NewTask{Kind: "plain", Key: "fan", Bucket: bk}
				}
				if _, err := s.CreateTasks(ctx, nts); err != nil {
					b.Fatal(err)
				}
			default:
				spent = 0
				advance(claim("root"))
				spent = 0
			}
			kind := map[string]string{"plain": "plain", "fan-in": "step"}[shape]
			for done := 0; done < b.N; {
				batch := claim(kind)
				if len(batch) == 0 {
					b.Fatalf("%d of %d tasks done and nothing to claim", done, b.N)
				}
				advance(batch)
				done += len(batch)
			}
			b.ReportMetric(float64(spent.Nanoseconds())/1000/float64(b.N), "us/task")
		})
	}
}

// fanOutFanIn is a pipeline of a root, n steps that depend on it and a
// fan-in that depends on all of them.
func fanOutFanIn(n int) store.NewPipeline {
	steps := []task.Step{{Name: "root", Kind: "root"}}
	in := task.Step{Name: "in", Kind: "in"}
	for i := range n {
		name := fmt.Sprintf("s%d", i)
		steps = append(steps, task.Step{Name: name, Kind: "step", DependsOn: []task.Dependency{{Step: "root"}}})
		in.DependsOn = append(in.DependsOn, task.Dependency{Step: name})
	}
	return store.NewPipeline{Name: "fan", Key: "fan", Steps: append(steps, in)}
}
