package memory

import (
	"sync"
	"time"
)

// ManualClockStart is where a ManualClock starts when it is given no time:
// a fixed instant, so that tests are reproducible, and not the zero time,
// which the store reads as "unset".
var ManualClockStart = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// ManualClock is a clock that moves only when told to. Pass its Now to
// [WithClock] and advance it to expire leases and make tasks due without
// sleeping. It is safe for concurrent use; the zero value starts at
// ManualClockStart.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a clock showing start (ManualClockStart when start
// is zero).
func NewManualClock(start time.Time) *ManualClock {
	c := &ManualClock{}
	c.Set(start)
	return c
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		c.now = ManualClockStart
	}
	return c.now
}

// Advance moves the clock on by d (back, if d is negative).
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		c.now = ManualClockStart
	}
	c.now = c.now.Add(d)
}

// Set shows t from now on (ManualClockStart when t is zero).
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
