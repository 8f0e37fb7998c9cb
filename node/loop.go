package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flotilla-dev/flotilla/internal/clock"
)

// errLoopStopped is the cancellation cause of a loop's context at stop.
var errLoopStopped = errors.New("loop stopped")

// loop is one background goroutine with one lifecycle: start returns once
// the goroutine runs, stop cancels it and waits until it has ended. Both are
// safe to call twice, and stop without start. A loop is not restarted.
type loop struct {
	name string
	// wake pokes the loop: a notification, a freed slot, a new lease. One
	// pending poke is enough, since a pass sees everything that happened
	// before it started.
	wake chan struct{}

	mu     sync.Mutex
	cancel context.CancelCauseFunc
	done   chan struct{}
}

func newLoop(name string) *loop {
	return &loop{name: name, wake: make(chan struct{}, 1)}
}

// start runs run(ctx) in a goroutine of its own until ctx ends or stop.
func (l *loop) start(ctx context.Context, run func(ctx context.Context)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done != nil {
		return fmt.Errorf("%s loop: already started", l.name)
	}
	ctx, l.cancel = context.WithCancelCause(ctx)
	done := make(chan struct{})
	l.done = done
	running := make(chan struct{})
	go func() {
		defer close(done)
		close(running)
		run(ctx)
	}()
	<-running
	return nil
}

// poke wakes the loop without blocking.
func (l *loop) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// signalStop cancels the loop without waiting for it to end.
func (l *loop) signalStop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancel != nil {
		l.cancel(errLoopStopped)
	}
}

// ended is closed once the loop has ended, or was never started.
func (l *loop) ended() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return l.done
}

// stop cancels the loop and waits until it has ended.
func (l *loop) stop() {
	l.signalStop()
	<-l.ended()
}

// stopWithin is stop that gives up waiting when ctx ends, for a loop that
// may be stuck in a handler that ignores cancellation. It reports whether
// the loop ended.
func (l *loop) stopWithin(ctx context.Context) bool {
	l.signalStop()
	select {
	case <-l.ended():
		return true
	case <-ctx.Done():
		return false
	}
}

// every runs fn whenever interval passes on clk or the loop is poked, until
// ctx ends; with first set, it also runs fn at once. The interval counts
// from the end of the previous run, so a slow store is not hammered.
func every(ctx context.Context, clk clock.Clock, interval time.Duration, wake chan struct{}, first bool, fn func(context.Context)) {
	if first {
		fn(ctx)
	}
	for pause(ctx, clk, interval, wake) {
		fn(ctx)
	}
}

// paced runs fn at once, then again once the pause fn returned has passed
// on clk or the loop is poked, until ctx ends.
func paced(ctx context.Context, clk clock.Clock, wake chan struct{}, fn func(context.Context) time.Duration) {
	for pause(ctx, clk, fn(ctx), wake) {
	}
}

// pause waits d on clk, or until the loop is poked; it reports whether ctx
// is still live.
func pause(ctx context.Context, clk clock.Clock, d time.Duration, wake chan struct{}) bool {
	t := clk.AfterFunc(d, func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	select {
	case <-ctx.Done():
		t.Stop()
		return false
	case <-wake:
		t.Stop()
	}
	return ctx.Err() == nil
}

// sleep waits d on clk, or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	passed := make(chan struct{})
	t := clk.AfterFunc(d, func() { close(passed) })
	select {
	case <-passed:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}
