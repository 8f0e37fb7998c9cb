package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// BenchmarkCreateTasks inserts batches of 1,000 tasks; the time is per task.
func BenchmarkCreateTasks(b *testing.B) {
	ctx := context.Background()
	s := open(b, filepath.Join(b.TempDir(), "bench.db"))
	if _, err := s.Migrate(ctx, 64); err != nil {
		b.Fatal(err)
	}
	const batch = 1000
	tasks := make([]store.NewTask, batch)
	for i := range tasks {
		tasks[i] = store.NewTask{Kind: "noop", Bucket: i % 64}
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		if _, err := s.CreateTasks(ctx, tasks[:min(batch, b.N-done)]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimAndComplete claims tasks 100 at a time and completes them
// in one AdvanceActive; the time is per task.
func BenchmarkClaimAndComplete(b *testing.B) {
	ctx := context.Background()
	s := open(b, filepath.Join(b.TempDir(), "bench.db"))
	if _, err := s.Migrate(ctx, 64); err != nil {
		b.Fatal(err)
	}
	tasks := make([]store.NewTask, 1000)
	for i := range tasks {
		tasks[i] = store.NewTask{Kind: "noop", Bucket: i % 64}
	}
	for done := 0; done < b.N; done += len(tasks) {
		if _, err := s.CreateTasks(ctx, tasks); err != nil {
			b.Fatal(err)
		}
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "o", Node: "n", Buckets: bucket.All(64), TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	held := make([]store.HeldBucket, len(leases))
	for i, l := range leases {
		held[i] = store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch}
	}
	b.ResetTimer()
	for done := 0; done < b.N; {
		claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "o", Node: "n", Buckets: held, Kinds: []string{"noop"},
			Limit: min(100, b.N-done), LeaseTTL: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		batch := make([]store.ActiveTransition, len(claimed))
		for i, t := range claimed {
			batch[i] = store.ActiveTransition{Ref: t.Ref(), To: task.Succeeded, Node: "n"}
		}
		if _, err := s.AdvanceActive(ctx, "o", batch); err != nil {
			b.Fatal(err)
		}
		done += len(claimed)
	}
}

// BenchmarkConcurrentSmallWrites: many callers each creating one task at a
// time, as submitters and a node's small writes do, so that the writer
// commits them in groups; the time is per task.
func BenchmarkConcurrentSmallWrites(b *testing.B) {
	ctx := context.Background()
	s := open(b, filepath.Join(b.TempDir(), "bench.db"))
	if _, err := s.Migrate(ctx, 64); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Bucket: 1}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
