package schedule

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string]string{"": Skip, "skip": Skip, "latest": Latest} {
		got, err := ParsePolicy(in)
		if err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"Latest", "all", " skip"} {
		_, err := ParsePolicy(in)
		if err == nil || !errors.Is(err, ErrInvalidPolicy) {
			t.Fatalf("ParsePolicy(%q) = %v, want ErrInvalidPolicy", in, err)
		}
		for _, w := range []string{`"` + in + `"`, `"skip"`, `"latest"`} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not contain %s", err, w)
			}
		}
	}
}

func TestDecide(t *testing.T) {
	T := utc("2026-01-01T12:00:00Z")
	sec := func(n int) time.Time { return T.Add(time.Duration(n) * time.Second) }
	min := func(n int) time.Time { return T.Add(time.Duration(n) * time.Minute) }
	tests := []struct {
		name       string
		expr       string
		storedNext time.Time
		now        time.Time
		policy     string
		misfire    time.Duration
		want       Decision
	}{
		{"not due", "@every 1m", T, sec(-1), Skip, 0,
			Decision{Next: T}},
		{"due exactly", "@every 1m", T, T, Skip, 0,
			Decision{Fire: true, ScheduledFor: T, Next: min(1)}},
		{"within misfire", "@every 1m", T, sec(3), Skip, 5 * time.Second,
			Decision{Fire: true, ScheduledFor: T, Next: min(1)}},
		{"at the default misfire", "@every 1m", T, sec(5), Skip, 0,
			Decision{Fire: true, ScheduledFor: T, Next: min(1)}},
		{"just beyond the default misfire, skip", "@every 1m", T, sec(6), Skip, 0,
			Decision{Next: min(1), Skipped: 1}},
		{"just beyond the default misfire, latest", "@every 1m", T, sec(6), Latest, 0,
			Decision{Fire: true, ScheduledFor: T, Next: min(1)}},
		// Behind by less than the threshold: one tick per call, and the
		// returned Next (T+1s) is itself already due.
		{"behind within misfire", "@every 1s", T, sec(3), Skip, 5 * time.Second,
			Decision{Fire: true, ScheduledFor: T, Next: sec(1)}},
		// Missed ticks T, T+1m, ..., T+10m (11 of them); the latest is 30s
		// late, beyond the 5s threshold.
		{"late, skip", "@every 1m", T, sec(630), Skip, 5 * time.Second,
			Decision{Next: min(11), Skipped: 11}},
		{"late, latest", "@every 1m", T, sec(630), Latest, 5 * time.Second,
			Decision{Fire: true, ScheduledFor: min(10), Next: min(11), Skipped: 10}},
		// @every 1s, ten minutes behind: the missed ticks are T, T+1s, ...,
		// T+600s, that is 601 ticks, since now (T+600s) is itself a tick and
		// is due. That last one is 0s late, so even Skip fires it: the 600
		// ticks T..T+599s are skipped, and Next is T+601s.
		{"one second ticks, ten minutes late, skip", "@every 1s", T, min(10), Skip, 5 * time.Second,
			Decision{Fire: true, ScheduledFor: min(10), Next: sec(601), Skipped: 600}},
		{"one second ticks, ten minutes late, latest", "@every 1s", T, min(10), Latest, 5 * time.Second,
			Decision{Fire: true, ScheduledFor: min(10), Next: sec(601), Skipped: 600}},
		// A stored time off the anchor grid (the spec changed, say) counts
		// as one missed tick, followed by T+1m..T+5m.
		{"unaligned stored time", "@every 1m", sec(10), sec(330), Skip, 5 * time.Second,
			Decision{Next: min(6), Skipped: 6}},
		{"unaligned stored time, latest", "@every 1m", sec(10), sec(330), Latest, 5 * time.Second,
			Decision{Fire: true, ScheduledFor: min(5), Next: min(6), Skipped: 5}},
		// Late, but no tick after the stored one yet.
		{"late, only the stored tick, latest", "@hourly", T, min(10), Latest, 0,
			Decision{Fire: true, ScheduledFor: T, Next: min(60)}},
		// Cron: 12:00, 12:05, ..., 13:00 missed (13 ticks); 13:00 is 2m late.
		{"cron late, skip", "*/5 * * * *", T, min(62), Skip, 0,
			Decision{Next: min(65), Skipped: 13}},
		{"cron late, latest", "*/5 * * * *", T, min(62), Latest, 0,
			Decision{Fire: true, ScheduledFor: min(60), Next: min(65), Skipped: 12}},
		{"cron late, latest tick within misfire", "*/5 * * * *", T, sec(3602), Skip, 0,
			Decision{Fire: true, ScheduledFor: min(60), Next: min(65), Skipped: 12}},
		{"cron in Berlin, days late, latest", "0 9 * * *", utc("2026-01-10T08:00:00Z"), utc("2026-01-15T12:00:00Z"), Latest, 0,
			Decision{Fire: true, ScheduledFor: utc("2026-01-15T08:00:00Z"), Next: utc("2026-01-16T08:00:00Z"), Skipped: 5}},
		{"unknown policy is skip", "@every 1m", T, sec(630), "bogus", 5 * time.Second,
			Decision{Next: min(11), Skipped: 11}},
		{"no stored time", "@every 1m", time.Time{}, sec(30), Skip, 0,
			Decision{Next: min(1)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tz := ""
			if strings.Contains(tc.name, "Berlin") {
				tz = "Europe/Berlin"
			}
			got := Decide(mustParse(t, tc.expr, tz), tc.storedNext, tc.now, tc.policy, tc.misfire)
			if !sameDecision(got, tc.want) {
				t.Errorf("Decide = %+v\nwant     %+v", got, tc.want)
			}
		})
	}
}

func sameDecision(a, b Decision) bool {
	return a.Fire == b.Fire && a.ScheduledFor.Equal(b.ScheduledFor) && a.Next.Equal(b.Next) && a.Skipped == b.Skipped
}

// TestDecideCallerLoop plays the holder: fire while Decide says so, storing
// Next each time.
func TestDecideCallerLoop(t *testing.T) {
	T := utc("2026-01-01T12:00:00Z")
	now := T.Add(3500 * time.Millisecond)
	s := mustParse(t, "@every 1s", "")
	next := T
	var fired []time.Time
	for range 100 {
		d := Decide(s, next, now, Skip, 5*time.Second)
		if d.Fire {
			fired = append(fired, d.ScheduledFor)
		}
		if d.Next.Equal(next) {
			break
		}
		next = d.Next
	}
	if len(fired) != 4 || !fired[0].Equal(T) || !fired[3].Equal(T.Add(3*time.Second)) {
		t.Errorf("fired %v, want T..T+3s", fired)
	}
	if want := T.Add(4 * time.Second); !next.Equal(want) {
		t.Errorf("stored next = %s, want %s", next, want)
	}
}

// TestDecideFarBehind checks that schedules years behind are decided in
// bounded time, with exact counts for @every and capped counts for cron.
func TestDecideFarBehind(t *testing.T) {
	stored := utc("2000-01-01T00:00:00Z")
	now := utc("2026-01-01T00:00:00.5Z")
	start := time.Now()

	// 2000-01-01 to 2026-01-01 is 820,540,800 seconds; the tick at
	// 2026-01-01T00:00:00Z is 0.5s late and fired, the ones before skipped.
	d := Decide(mustParse(t, "@every 1s", ""), stored, now, Skip, 0)
	want := Decision{Fire: true, ScheduledFor: utc("2026-01-01T00:00:00Z"), Next: utc("2026-01-01T00:00:01Z"), Skipped: 820_540_800}
	if !sameDecision(d, want) {
		t.Errorf("@every 1s: Decide = %+v, want %+v", d, want)
	}

	d = Decide(mustParse(t, "* * * * * *", ""), stored, now, Skip, 0)
	want.Skipped = MaxCounted
	if !sameDecision(d, want) {
		t.Errorf("cron every second: Decide = %+v, want %+v", d, want)
	}

	// Centuries: beyond what time.Duration holds.
	d = Decide(mustParse(t, "@every 1h", ""), utc("1200-01-01T00:00:00Z"), now, Latest, 0)
	if !d.Fire || !d.ScheduledFor.Equal(utc("2026-01-01T00:00:00Z")) || d.Skipped < 7_000_000 {
		t.Errorf("@every 1h since 1200: Decide = %+v", d)
	}
	d = Decide(mustParse(t, "0 3 * * *", ""), utc("1200-01-01T03:00:00Z"), now, Latest, 0)
	if !d.Fire || !d.ScheduledFor.Equal(utc("2025-12-31T03:00:00Z")) || d.Skipped != MaxCounted {
		t.Errorf("daily cron since 1200: Decide = %+v", d)
	}

	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("took %s", elapsed)
	}
}

// TestDecideAccounting checks, against a tick-by-tick count, that every tick
// from the stored one up to Next is either fired or counted as skipped, and
// that ScheduledFor is a missed tick, at most now.
func TestDecideAccounting(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	specs := []Spec{
		mustParse(t, "@every 1s", ""), mustParse(t, "@every 7s", ""), mustParse(t, "@every 1m", ""),
		mustParse(t, "*/5 * * * *", ""), mustParse(t, "*/10 * * * * *", "Europe/Berlin"),
		mustParse(t, "0 9-17 * * 1-5", "America/New_York"),
	}
	base := utc("2026-03-01T00:00:00Z")
	for i := range 600 {
		s := specs[i%len(specs)]
		stored := s.Next(base.Add(time.Duration(rng.Int64N(int64(30 * 24 * time.Hour)))))
		now := stored.Add(time.Duration(rng.Int64N(int64(time.Hour))) - time.Minute)
		policy := []string{Skip, Latest}[rng.IntN(2)]
		misfire := time.Duration(rng.Int64N(int64(20 * time.Second)))
		d := Decide(s, stored, now, policy, misfire)

		if stored.After(now) {
			if d.Fire || !d.Next.Equal(stored) || d.Skipped != 0 {
				t.Fatalf("%s not due: %+v", s, d)
			}
			continue
		}
		ticks := 0
		for tk := stored; tk.Before(d.Next); tk = s.Next(tk) {
			ticks++
		}
		fired := 0
		if d.Fire {
			fired = 1
			if d.ScheduledFor.Before(stored) || d.ScheduledFor.After(now) {
				t.Fatalf("%s stored %s now %s: fired %s", s, stored, now, d.ScheduledFor)
			}
		}
		if d.Skipped+fired != ticks {
			t.Fatalf("%s stored %s now %s %s misfire %s: %+v accounts for %d ticks of %d",
				s, stored, now, policy, misfire, d, d.Skipped+fired, ticks)
		}
		if !d.Next.After(stored) {
			t.Fatalf("%s: Next %s not after stored %s", s, d.Next, stored)
		}
	}
}
