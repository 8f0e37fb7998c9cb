package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// BenchmarkStopToCancel measures, on PostgreSQL, the time from the call that
// issues a stop (commands.Stop, as `worker stop` does) to the cancellation
// of the running handler's context: with notifications, and with them cut,
// where the node's poll (CommandPoll 1 s) must find the command.
//
//	go test -run '^$' -bench StopToCancel -benchtime 200x ./node/
func BenchmarkStopToCancel(b *testing.B) {
	b.Run("notify", func(b *testing.B) { benchStopToCancel(b, false) })
	b.Run("poll-only", func(b *testing.B) { benchStopToCancel(b, true) })
}

// quietStore hides the store's Listen: every notification is missed.
type quietStore struct{ store.Store }

func benchStopToCancel(b *testing.B, pollOnly bool) {
	ctx := context.Background()
	pg, err := postgres.New(ctx, testdb.New(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pg.Close)
	if _, err := pg.Migrate(ctx, 0); err != nil {
		b.Fatal(err)
	}
	var s store.Store = pg
	cfg := Config{AllBuckets: true, Logger: zap.NewNop(), CommandPoll: DefaultCommandPoll}
	if pollOnly {
		// The claim polls fast so that only the command's delay is slow.
		s, cfg.PollInterval = quietStore{pg}, 20*time.Millisecond
	}
	n, err := New(s, cfg)
	if err != nil {
		b.Fatal(err)
	}
	started := make(chan int64, 1)
	cancelled := make(chan time.Time, 1)
	n.Register("block", func(ctx context.Context, t *task.Task) error {
		started <- t.ID
		<-ctx.Done()
		cancelled <- time.Now()
		return ctx.Err()
	})
	if err := n.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Shutdown(context.Background()) })

	latencies := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tk, err := n.Submit(ctx, SubmitRequest{Kind: "block", Key: fmt.Sprintf("stop-%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		<-started
		t0 := time.Now()
		if _, err := commands.Stop(ctx, pg, tk.ID, "", "bench"); err != nil {
			b.Fatal(err)
		}
		latencies = append(latencies, (<-cancelled).Sub(t0))
		for {
			got, err := pg.GetTask(ctx, tk.ID)
			if err != nil {
				b.Fatal(err)
			}
			if got.Status == task.Stopped {
				break
			}
			time.Sleep(time.Millisecond) // a benchmark's pacing, not a test's wait
		}
	}
	b.StopTimer()
	reportPercentiles(b, latencies)
}
