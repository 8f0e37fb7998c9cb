package schedule

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"time"
)

// Catch-up policies, equal to store.CatchUpSkip and store.CatchUpLatest.
const (
	// Skip drops ticks missed by more than the misfire threshold and
	// carries on with the next tick after now. It is the default.
	Skip = "skip"
	// Latest fires the most recent missed tick (one task, whatever the
	// number missed) and carries on with the next tick after now.
	Latest = "latest"
)

// ErrInvalidPolicy is matched, through errors.Is, by ParsePolicy's errors.
var ErrInvalidPolicy = errors.New("invalid catch-up policy")

// ParsePolicy validates a catch-up policy: "skip" or "latest", with ""
// meaning "skip".
func ParsePolicy(s string) (string, error) {
	switch s {
	case "", Skip:
		return Skip, nil
	case Latest:
		return Latest, nil
	}
	return "", fmt.Errorf("%w %q: want %q or %q", ErrInvalidPolicy, s, Skip, Latest)
}

// DefaultMisfire is the misfire threshold Decide uses when given zero or less:
// a tick at most this late is fired as if on time, whatever the catch-up
// policy. It is a constant rather than a fraction of the period because
// lateness comes from the firing side, not from the schedule: the holder's
// poll interval, a lease handover, a slow transaction or clock skew between
// nodes. Five seconds covers those for a holder polling about once a second,
// while a tick missed because nobody held the bucket (typically tens of
// seconds or more) goes to the catch-up policy. A holder that polls less often
// should pass a threshold of at least its poll interval plus a margin, or its
// ordinary lateness would be treated as missed ticks.
const DefaultMisfire = 5 * time.Second

// MaxCounted caps the count of skipped ticks for cron expressions, which are
// counted one tick at a time. A Skipped of MaxCounted means "at least that
// many". "@every" counts are exact, computed arithmetically.
const MaxCounted = 10000

// Decision is what the holder of a schedule's bucket does with it now.
type Decision struct {
	// Fire reports whether a task is to be fired for ScheduledFor.
	Fire bool
	// ScheduledFor is the tick to fire (the task's scheduled_for); zero
	// when Fire is false.
	ScheduledFor time.Time
	// Next is the schedule's next fire time to store. When it differs from
	// the stored one, the holder advances it by compare-and-set (through
	// store.FireSchedules). It may already be due when the
	// schedule fell behind by less than the misfire threshold; the holder
	// then calls Decide again with it.
	Next time.Time
	// Skipped is the number of ticks from the stored next fire time up to
	// (not including) Next that are not fired. It is capped at MaxCounted
	// for cron expressions.
	Skipped int
}

// Decide decides what to do with a schedule whose stored next fire time is
// storedNext, at time now, under the catch-up policy (Skip or Latest; any
// other value is treated as Skip, the default) and the misfire threshold
// (DefaultMisfire when zero or less).
//
//   - storedNext after now: nothing is due; Next is storedNext.
//   - now - storedNext <= misfire: the stored tick is fired as on time, and
//     Next is the tick after it, even if that one is also due: one tick per
//     call, and the caller loops.
//   - later than that, ticks were missed. Next is the first tick after now.
//     With Latest, the most recent tick at or before now is fired and the
//     ones before it are skipped. With Skip, they are all skipped, except
//     that the most recent one is still fired if it is itself no more than
//     misfire late: a tick only a little late is fired, not skipped.
//
// A zero storedNext (a schedule never given a fire time) fires nothing, and
// its Next is spec.First(now). ScheduledFor is always the stored next fire
// time or a tick of spec computed from it, never now. Decide does no I/O and
// takes time bounded by about seventy cron evaluations plus at most
// MaxCounted for counting, however far behind the schedule is.
func Decide(spec Spec, storedNext, now time.Time, policy string, misfire time.Duration) Decision {
	if misfire <= 0 {
		misfire = DefaultMisfire
	}
	if storedNext.IsZero() {
		return Decision{Next: spec.First(now)}
	}
	if storedNext.After(now) {
		return Decision{Next: storedNext}
	}
	if now.Sub(storedNext) <= misfire {
		return Decision{Fire: true, ScheduledFor: storedNext, Next: spec.Next(storedNext)}
	}

	// Missed ticks: storedNext, then every tick of spec in (storedNext, now].
	last, ok := spec.lastTick(storedNext, now)
	if !ok {
		last = storedNext
	}
	before := 0 // missed ticks before last: storedNext and those between
	if ok {
		before = addCapped(spec.countBetween(storedNext, last), 1, spec.every > 0)
	}
	d := Decision{Next: spec.Next(now)}
	if policy == Latest || now.Sub(last) <= misfire {
		d.Fire, d.ScheduledFor, d.Skipped = true, last, before
	} else {
		d.Skipped = addCapped(before, 1, spec.every > 0)
	}
	return d
}

// lastTick returns the latest tick of s in (from, to], and false if there is
// none.
func (s Spec) lastTick(from, to time.Time) (time.Time, bool) {
	if !to.After(from) {
		return time.Time{}, false
	}
	if s.every > 0 {
		k := floorTicks(to, s.anchor, s.every)
		t := s.tick(k)
		return t, t.After(from)
	}
	if s.cron == nil {
		return time.Time{}, false
	}
	// has(d) reports whether a tick lies in (to-d, to]. It is monotone in d,
	// so the tick is found by doubling d, then bisecting it down to a
	// one-second interval, which holds at most one cron tick (cron ticks are
	// whole seconds). to.Sub saturates at about 292 years; a valid cron
	// expression ticks at least every eight years or so.
	span := to.Sub(from)
	has := func(d time.Duration) bool {
		n := s.Next(to.Add(-d))
		return !n.IsZero() && !n.After(to)
	}
	lo, hi := time.Duration(0), time.Second
	for {
		if hi >= span {
			hi = span
			if !has(hi) {
				return time.Time{}, false
			}
			break
		}
		if has(hi) {
			break
		}
		lo = hi
		if hi > span/2 {
			hi = span // also keeps hi*2 from overflowing
		} else {
			hi *= 2
		}
	}
	// Invariant: has(hi), !has(lo) (has(0) is false: Next(to) > to).
	for hi-lo > time.Second {
		mid := lo + (hi-lo)/2
		if has(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return s.Next(to.Add(-hi)), true
}

// countBetween returns the number of ticks of s strictly between from and
// to, where to is itself a tick after from: exact for "@every", capped at
// MaxCounted for cron.
func (s Spec) countBetween(from, to time.Time) int {
	if s.every > 0 {
		// Ticks in (from, to] number floor((to-a)/D) - floor((from-a)/D);
		// to is one of them.
		n := floorTicks(to, s.anchor, s.every)
		n.Sub(n, floorTicks(from, s.anchor, s.every))
		n.Sub(n, big.NewInt(1))
		if !n.IsInt64() || n.Int64() > math.MaxInt {
			return math.MaxInt
		}
		return int(n.Int64())
	}
	count := 0
	for t := s.Next(from); !t.IsZero() && t.Before(to) && count < MaxCounted; t = s.Next(t) {
		count++
	}
	return count
}

// addCapped returns a+b, capped at MaxCounted unless exact, and at math.MaxInt.
func addCapped(a, b int, exact bool) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	if !exact && a+b > MaxCounted {
		return MaxCounted
	}
	return a + b
}
