package schedule

import (
	"math/bits"
	"time"
)

// Cron ticks in a time zone.
//
// The cron parser's own Next walks wall clocks in the zone and corrects for
// daylight saving time as it goes; on a day whose midnight does not exist
// (Asia/Beirut, Africa/Cairo) that correction steps back into the previous
// day and the day's tick is lost. Here the zone is applied separately:
// the time line is cut into the zone's periods of constant UTC offset
// (time.Time.ZoneBounds), in each of which the wall clock is the instant plus
// the offset, with no jump. Matching wall clocks are searched in UTC, where
// the parser has no daylight saving time to correct, and turned back into
// instants with the period's offset. Between two periods lies either a jump
// forward, whose missing wall clocks fire at the instant of the jump, or a
// fall back, whose repeated wall clocks the earlier period already had.

// horizon is how far cronNext looks for a tick: a valid expression ticks at
// least every eight years or so (29 February of a leap year after 2100).
const horizon = 15 * 366 * 24 * time.Hour

// maxOffset bounds the difference of two UTC offsets: real ones lie
// between -12h and +14h, and local mean times of the past within ±16h.
const maxOffset = 32 * time.Hour

// cronNext returns the first tick of the cron expression strictly after
// after, in UTC, by the rules of Spec.Next.
func (s Spec) cronNext(after time.Time) time.Time {
	local := after.In(s.loc)
	_, off := local.Zone()
	start, end := local.ZoneBounds()
	limit := after.Add(horizon)
	// w is the first matching wall clock after the wall clock of after.
	w := s.wallAfter(wallClock(after, off))
	for {
		if w.IsZero() {
			return time.Time{}
		}
		// Ticks in the period [start, end) at offset off.
		for end.IsZero() || w.Before(wallClock(end, off)) {
			if !s.seenBefore(w, start) {
				return instant(w, off)
			}
			if w = s.wallAfter(w); w.IsZero() {
				return time.Time{}
			}
		}
		if !end.Before(limit) {
			return time.Time{}
		}
		// The next period begins at end with offset next.
		_, next := end.In(s.loc).Zone()
		if next > off && w.Before(wallClock(end, next)) {
			// w lies in the wall clocks the jump forward skips.
			return end.UTC()
		}
		if next < off {
			// Clocks fall back: the new period starts at wall clocks
			// already passed, which seenBefore sorts out.
			if w = s.wallAfter(wallClock(end, next).Add(-time.Second)); w.IsZero() {
				return time.Time{}
			}
		}
		start, off = end, next
		_, end = end.In(s.loc).ZoneBounds()
	}
}

// seenBefore reports whether the wall clock w, reached in the period that
// begins at start, already occurred in an earlier period: a time repeated
// when clocks fall back, which fires only at its first occurrence. Periods
// are looked at backwards while w would lie before them; a zone's periods
// last months, so this is one or two steps.
func (s Spec) seenBefore(w, start time.Time) bool {
	if start.IsZero() || w.Sub(start) > maxOffset {
		// Past any wall clock of an earlier period: offsets lie within
		// ±maxOffset/2 of UTC.
		return false
	}
	for range 4 {
		if start.IsZero() {
			return false
		}
		prev := start.Add(-time.Nanosecond).In(s.loc)
		_, off := prev.Zone()
		at := instant(w, off)
		if !at.Before(start) {
			return false // after the earlier period's wall clocks
		}
		begin, _ := prev.ZoneBounds()
		if begin.IsZero() || !at.Before(begin) {
			return true
		}
		start = begin
	}
	return false
}

// wallAfter returns the first wall clock, written as a UTC time, strictly
// after w that matches the expression, or the zero time if there is none in
// the next 15 years. It walks the expression's fields from the year down to
// the second, jumping to the next set bit of each field rather than
// stepping one unit at a time.
func (s Spec) wallAfter(w time.Time) time.Time {
	f := s.cron
	w = w.UTC().Truncate(time.Second).Add(time.Second)
	y, mo, d := w.Date()
	h, mi, sec := w.Clock()
	lastYear := y + 15
	for y <= lastYear {
		m, ok := nextBit(f.Month, int(mo), 12)
		if !ok {
			y, mo, d, h, mi, sec = y+1, time.January, 1, 0, 0, 0
			continue
		}
		if time.Month(m) != mo {
			mo, d, h, mi, sec = time.Month(m), 1, 0, 0, 0
		}
		if d > daysIn(y, mo) {
			if mo == time.December {
				y, mo = y+1, time.January
			} else {
				mo++
			}
			d, h, mi, sec = 1, 0, 0, 0
			continue
		}
		if !dayMatches(f.Dom, f.Dow, y, mo, d) {
			d, h, mi, sec = d+1, 0, 0, 0
			continue
		}
		hh, ok := nextBit(f.Hour, h, 23)
		if !ok {
			d, h, mi, sec = d+1, 0, 0, 0
			continue
		}
		if hh != h {
			h, mi, sec = hh, 0, 0
		}
		mm, ok := nextBit(f.Minute, mi, 59)
		if !ok {
			h, mi, sec = h+1, 0, 0
			if h == 24 {
				d, h = d+1, 0
			}
			continue
		}
		if mm != mi {
			mi, sec = mm, 0
		}
		ss, ok := nextBit(f.Second, sec, 59)
		if !ok {
			mi, sec = mi+1, 0
			if mi == 60 {
				h, mi = h+1, 0
				if h == 24 {
					d, h = d+1, 0
				}
			}
			continue
		}
		return time.Date(y, mo, d, h, mi, ss, 0, time.UTC)
	}
	return time.Time{}
}

// starBit is the bit the cron parser sets in a field written "*" or "?".
const starBit = 1 << 63

// nextBit returns the smallest value v >= from, v <= max, set in the field
// mask.
func nextBit(mask uint64, from, max int) (int, bool) {
	m := mask &^ starBit &^ (1<<uint(from) - 1)
	if m == 0 {
		return 0, false
	}
	v := bits.TrailingZeros64(m)
	return v, v <= max
}

// dayMatches is the cron rule for days: when the day of the month or the
// day of the week is "*", both fields must match; when both are
// restricted, either one may ("0 0 1 * 1" is the 1st of the month and every
// Monday).
func dayMatches(dom, dow uint64, y int, mo time.Month, d int) bool {
	domOK := dom&(1<<uint(d)) != 0
	dowOK := dow&(1<<uint(time.Date(y, mo, d, 0, 0, 0, 0, time.UTC).Weekday())) != 0
	if dom&starBit != 0 || dow&starBit != 0 {
		return domOK && dowOK
	}
	return domOK || dowOK
}

// daysIn returns the number of days of month mo of year y.
func daysIn(y int, mo time.Month) int {
	return time.Date(y, mo+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// wallClock returns the wall clock of t at the UTC offset off (seconds east
// of UTC), written as a UTC time.
func wallClock(t time.Time, off int) time.Time {
	return t.UTC().Add(time.Duration(off) * time.Second)
}

// instant is the inverse of wallClock: the instant whose wall clock at the
// offset off is w.
func instant(w time.Time, off int) time.Time {
	return w.Add(-time.Duration(off) * time.Second)
}
