// Package clock lets time-driven code take its clock as a dependency, so
// that tests of deadlines and step-downs move time by hand instead of
// sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock is the part of package time that deadline logic uses.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not happened; it reports whether it
	// did so.
	Stop() bool
}

// Real is the system clock (with its monotonic reading).
type Real struct{}

func (Real) Now() time.Time { return time.Now() }

func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Manual is a clock that moves only when told to. Timers run only inside
// Advance, synchronously and in due order, before it returns; a timer set
// for a time already passed runs at the next Advance.
type Manual struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

// NewManual returns a manual clock set to start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

func (m *Manual) AfterFunc(d time.Duration, f func()) Timer {
	m.mu.Lock()
	t := &manualTimer{clock: m, at: m.now.Add(d), f: f}
	m.timers = append(m.timers, t)
	m.mu.Unlock()
	return t
}

// Advance moves the clock forward by d and runs the timers that fall due.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	m.now = m.now.Add(d)
	now := m.now
	m.mu.Unlock()
	for {
		t := m.popDue(now)
		if t == nil {
			return
		}
		t.f()
	}
}

func (m *Manual) popDue(now time.Time) *manualTimer {
	m.mu.Lock()
	defer m.mu.Unlock()
	best := -1
	for i, t := range m.timers {
		if !t.at.After(now) && (best < 0 || t.at.Before(m.timers[best].at)) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	t := m.timers[best]
	m.timers = append(m.timers[:best], m.timers[best+1:]...)
	return t
}

type manualTimer struct {
	clock *Manual
	at    time.Time
	f     func()
}

func (t *manualTimer) Stop() bool {
	m := t.clock
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, other := range m.timers {
		if other == t {
			m.timers = append(m.timers[:i], m.timers[i+1:]...)
			return true
		}
	}
	return false
}
