package schedule

import (
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"
	// The zone database is compiled in, so that a zoned schedule fires the
	// same on a host without zoneinfo files (a scratch container) as on any
	// other. The host's files are still preferred when present.
	_ "time/tzdata"

	"github.com/robfig/cron/v3"
)

// ErrInvalidSpec is matched, through errors.Is, by every *SpecError.
var ErrInvalidSpec = errors.New("invalid schedule")

// SpecError reports a schedule expression or time zone that cannot be used.
type SpecError struct {
	Expr   string // the expression as given
	Reason string // why it was refused
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("invalid schedule %q: %s", e.Expr, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidSpec) true for a *SpecError.
func (e *SpecError) Is(target error) bool { return target == ErrInvalidSpec }

// MinEvery is the shortest interval accepted by "@every". Intervals are
// whole seconds too: the store keeps fire times to the microsecond, and a
// tick with a fraction of a second would be stored earlier than computed,
// so the compare-and-set that advances it would never move it.
const MinEvery = time.Second

// parser accepts 5-field cron, 6-field cron with a leading seconds field, and
// descriptors such as "@hourly". "@every" is handled by this package, not by
// the parser, so that its ticks can be anchored.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour |
	cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Epoch is the anchor used by Parse for "@every" schedules: the Unix epoch,
// so "@every 1m" ticks at whole minutes, "@every 1h" at whole hours (UTC),
// and "@every 90s" at 00:00:00, 00:01:30, 00:03:00, ... counted from
// 1970-01-01T00:00:00Z.
var Epoch = time.Unix(0, 0).UTC()

// Spec is a parsed schedule expression in its time zone. The zero Spec has
// no ticks (Next returns the zero time); obtain one with Parse or
// ParseAnchored. A Spec is an immutable value, safe for concurrent use.
type Spec struct {
	expr   string         // canonical expression
	tz     string         // time zone name as given ("" = UTC)
	loc    *time.Location // loaded time zone
	every  time.Duration  // > 0 for "@every"
	anchor time.Time      // "@every" ticks are anchor + k*every
	// cron holds the expression's fields, non-nil for cron expressions and
	// descriptors. Its Location is UTC: it is only ever asked about wall
	// clocks written as UTC times, which have no daylight saving time; the
	// schedule's own zone is applied by cronNext.
	cron *cron.SpecSchedule
}

// Parse parses a schedule expression in the named IANA time zone ("" means
// UTC). It accepts
//
//   - a 5-field cron expression ("*/5 * * * *"),
//   - a 6-field cron expression whose first field is seconds ("30 0 * * * *"),
//   - a descriptor ("@hourly", "@daily", "@weekly", "@monthly", "@yearly"),
//   - "@every D" with a Go duration D of a whole number of seconds, at
//     least one.
//
// "@every" ticks are anchored at Epoch (the Unix epoch): they fall on
// Epoch + k×D, whatever the time zone, so "@every 1m" ticks at whole minutes.
// Use ParseAnchored for another anchor.
//
// The time zone "Local" is refused, because it would make ticks depend on
// the node. Time zone prefixes inside the expression ("TZ=", "CRON_TZ=") are
// refused too: the time zone is the schedule's own field.
func Parse(expr, timezone string) (Spec, error) {
	return ParseAnchored(expr, timezone, Epoch)
}

// ParseAnchored is Parse with the anchor for "@every" ticks: they fall on
// anchor + k×D for integer k (negative k included). The anchor is ignored
// for cron expressions and descriptors.
func ParseAnchored(expr, timezone string, anchor time.Time) (Spec, error) {
	bad := func(format string, args ...any) (Spec, error) {
		return Spec{}, &SpecError{Expr: expr, Reason: fmt.Sprintf(format, args...)}
	}
	fields := strings.Fields(expr)
	if len(fields) == 0 {
		return bad("empty expression")
	}
	if timezone == "Local" {
		return bad("time zone %q depends on the node; name an IANA zone, or \"\" for UTC", timezone)
	}
	loc, err := time.LoadLocation(timezone)
	if err != nil {
		return bad("unknown time zone %q: %v", timezone, err)
	}
	s := Spec{tz: timezone, loc: loc}

	if fields[0] == "@every" {
		if len(fields) != 2 {
			return bad("want \"@every <duration>\"")
		}
		d, err := time.ParseDuration(fields[1])
		if err != nil {
			return bad("%v", err)
		}
		if d < MinEvery {
			return bad("@every %s is shorter than %s", fields[1], MinEvery)
		}
		if d%time.Second != 0 {
			return bad("@every %s is not a whole number of seconds: give whole seconds, such as %s or %s",
				fields[1], formatDuration(d.Truncate(time.Second)), formatDuration(d.Truncate(time.Second)+time.Second))
		}
		s.every = d
		s.anchor = anchor
		s.expr = "@every " + formatDuration(d)
		return s, nil
	}
	if strings.HasPrefix(fields[0], "TZ=") || strings.HasPrefix(fields[0], "CRON_TZ=") {
		return bad("a time zone prefix is not allowed in the expression; set the schedule's time zone instead")
	}
	canon := strings.Join(fields, " ")
	sched, err := parseCron(canon)
	if err != nil {
		return bad("%v", err)
	}
	s.cron = sched
	s.expr = canon
	// An expression that matches no date at all (such as "0 0 31 4 *", the
	// 31st of April) would never fire.
	if s.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return bad("the expression never fires")
	}
	return s, nil
}

// parseCron calls the cron parser, turning a panic on odd input into an
// error, and returns its fields set to read wall clocks in UTC.
func parseCron(expr string) (sched *cron.SpecSchedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("%v", r)
		}
	}()
	parsed, err := parser.Parse(expr)
	if err != nil {
		return nil, err
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("unsupported expression")
	}
	fields := *spec
	fields.Location = time.UTC
	return &fields, nil
}

// String returns the canonical expression: fields separated by single
// spaces, and "@every" durations written without zero units ("@every 1m",
// "@every 1h30m", "@every 1m30s").
func (s Spec) String() string { return s.expr }

// Timezone returns the time zone name the Spec was parsed with ("" = UTC).
func (s Spec) Timezone() string { return s.tz }

// Every returns the interval of an "@every" Spec, and 0 for cron.
func (s Spec) Every() time.Duration { return s.every }

// Anchor returns the anchor of an "@every" Spec, and the zero time for cron.
func (s Spec) Anchor() time.Time { return s.anchor }

// Next returns the first tick strictly after after, in UTC.
//
// For "@every D" that is anchor + k×D for the smallest integer k that makes it
// later than after; the arithmetic is exact for any time.Time.
//
// For a cron expression the ticks are the instants whose wall clock in the
// Spec's time zone matches the expression, to the second, with two rules for
// the wall clocks that daylight saving time (or any change of a zone's
// offset) does not map to exactly one instant:
//
//   - a matching wall clock that does not exist, skipped when clocks jump
//     forward, fires at the first instant after the jump: a daily
//     "30 2 * * *" in America/New_York fires at 03:00 EDT on the day clocks
//     jump from 02:00 to 03:00, and "0 0 * * 5" in Africa/Cairo fires at
//     01:00 on the Friday whose midnight is skipped. However many matching
//     wall clocks one jump skips, they fire once, together with a tick at
//     that instant if there is one;
//
//   - a matching wall clock that occurs twice, repeated when clocks fall
//     back, fires once, at its first occurrence: a daily "30 1 * * *" in
//     America/New_York fires at 01:30 EDT and not again at 01:30 EST.
//
// So every day an expression names gets its tick, and no wall clock fires
// twice. Next returns the zero time only for the zero Spec, or when the
// expression has no tick in the next 15 years.
func (s Spec) Next(after time.Time) time.Time {
	switch {
	case s.every > 0:
		k := floorTicks(after, s.anchor, s.every)
		return s.tick(k.Add(k, big.NewInt(1)))
	case s.cron != nil:
		return s.cronNext(after)
	default:
		return time.Time{}
	}
}

// First returns the first tick strictly after now: the next fire time to
// store for a new (or re-enabled) schedule.
func (s Spec) First(now time.Time) time.Time { return s.Next(now) }

// nanos returns t as nanoseconds since the Unix epoch, exactly.
func nanos(t time.Time) *big.Int {
	n := big.NewInt(t.Unix())
	n.Mul(n, big.NewInt(int64(time.Second)))
	return n.Add(n, big.NewInt(int64(t.Nanosecond())))
}

// floorTicks returns k = floor((t - anchor) / every): the index of the last
// tick at or before t. Big integers keep it exact where time.Time.Sub would
// saturate (spans over ~292 years).
func floorTicks(t, anchor time.Time, every time.Duration) *big.Int {
	d := nanos(t)
	d.Sub(d, nanos(anchor))
	k, m := new(big.Int), new(big.Int)
	k.DivMod(d, big.NewInt(int64(every)), m) // Euclidean: m >= 0, so k is the floor
	return k
}

// tick returns anchor + k×every in UTC.
func (s Spec) tick(k *big.Int) time.Time {
	n := new(big.Int).Mul(k, big.NewInt(int64(s.every)))
	n.Add(n, nanos(s.anchor))
	sec, ns := new(big.Int), new(big.Int)
	sec.DivMod(n, big.NewInt(int64(time.Second)), ns)
	return time.Unix(sec.Int64(), ns.Int64()).UTC()
}

// formatDuration writes d like time.Duration.String, without zero trailing
// units: 1m rather than 1m0s, 1h rather than 1h0m0s.
func formatDuration(d time.Duration) string {
	out := d.String()
	if strings.HasSuffix(out, "m0s") {
		out = strings.TrimSuffix(out, "0s")
	}
	if strings.HasSuffix(out, "h0m") {
		out = strings.TrimSuffix(out, "0m")
	}
	return out
}
