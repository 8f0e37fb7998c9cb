package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/internal/clock"
)

func TestALoopHasOneLifecycle(t *testing.T) {
	never := newLoop("never started")
	never.stop() // without start: returns at once
	never.stop()

	l := newLoop("test")
	var running atomic.Bool
	if err := l.start(context.Background(), func(ctx context.Context) {
		running.Store(true)
		<-ctx.Done()
		running.Store(false)
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.start(context.Background(), func(context.Context) {}); err == nil {
		t.Error("a second start succeeded")
	}
	l.stop()
	if running.Load() {
		t.Error("stop returned before the loop ended")
	}
	l.stop() // twice: harmless
}

func TestEveryRunsOnTheClockAndOnAPoke(t *testing.T) {
	clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	l := newLoop("ticker")
	var runs atomic.Int64
	if err := l.start(context.Background(), func(ctx context.Context) {
		every(ctx, clk, time.Minute, l.wake, true, func(context.Context) { runs.Add(1) })
	}); err != nil {
		t.Fatal(err)
	}
	defer l.stop()
	eventually(t, "the run at start", func() bool { return runs.Load() == 1 })
	l.poke()
	eventually(t, "the run on a poke", func() bool { return runs.Load() == 2 })
	// The timer is armed after each run; keep moving the clock until the
	// interval has passed since it was.
	eventually(t, "a run when the interval passed", func() bool {
		clk.Advance(time.Minute)
		return runs.Load() >= 3
	})
}
