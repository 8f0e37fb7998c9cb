package clock

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flotilla-dev/flotilla/internal/patience"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestManualRunsDueTimersInOrder(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewManual(start)
	var fired []string
	c.AfterFunc(3*time.Second, func() { fired = append(fired, "3s") })
	c.AfterFunc(time.Second, func() { fired = append(fired, "1s") })
	stopped := c.AfterFunc(2*time.Second, func() { fired = append(fired, "2s") })
	if !stopped.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	if stopped.Stop() {
		t.Error("second Stop reported true")
	}
	c.Advance(999 * time.Millisecond)
	if len(fired) != 0 {
		t.Fatalf("fired %v before anything was due", fired)
	}
	c.Advance(5 * time.Second)
	if got := len(fired); got != 2 || fired[0] != "1s" || fired[1] != "3s" {
		t.Errorf("fired %v, want [1s 3s]", fired)
	}
	if want := start.Add(5999 * time.Millisecond); !c.Now().Equal(want) {
		t.Errorf("Now = %v, want %v", c.Now(), want)
	}
}

func TestRealAfterFunc(t *testing.T) {
	done := make(chan struct{})
	Real{}.AfterFunc(time.Millisecond, func() { close(done) })
	select {
	case <-done:
	case <-time.After(patience.Scale(10 * time.Second)):
		t.Fatal("a real timer did not fire")
	}
}
