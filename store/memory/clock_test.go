package memory_test

import (
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store/memory"
)

func TestManualClockMovesOnlyWhenTold(t *testing.T) {
	var zero memory.ManualClock
	if got := zero.Now(); !got.Equal(memory.ManualClockStart) {
		t.Fatalf("zero clock shows %v, want %v", got, memory.ManualClockStart)
	}
	start := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	c := memory.NewManualClock(start)
	if !c.Now().Equal(start) || !c.Now().Equal(start) {
		t.Fatalf("a manual clock moved by itself: %v", c.Now())
	}
	c.Advance(90 * time.Second)
	if want := start.Add(90 * time.Second); !c.Now().Equal(want) {
		t.Errorf("after Advance: %v, want %v", c.Now(), want)
	}
	c.Set(start)
	if !c.Now().Equal(start) {
		t.Errorf("after Set: %v, want %v", c.Now(), start)
	}
}

func TestManualClockIsSafeForConcurrentUse(t *testing.T) {
	c := memory.NewManualClock(time.Time{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		}()
	}
	wg.Wait()
	if want := memory.ManualClockStart.Add(800 * time.Millisecond); !c.Now().Equal(want) {
		t.Errorf("after 800 advances of 1ms: %v, want %v", c.Now(), want)
	}
}
