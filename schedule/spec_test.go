package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func mustParse(t testing.TB, expr, tz string) Spec {
	t.Helper()
	s, err := Parse(expr, tz)
	if err != nil {
		t.Fatalf("Parse(%q, %q): %v", expr, tz, err)
	}
	return s
}

func TestNext(t *testing.T) {
	tests := []struct {
		name, expr, tz string
		after, want    string
	}{
		// @every, anchored at the Unix epoch.
		{"every 1s mid-second", "@every 1s", "", "2026-01-02T03:04:05.5Z", "2026-01-02T03:04:06Z"},
		{"every 1s on a tick", "@every 1s", "", "2026-01-02T03:04:05Z", "2026-01-02T03:04:06Z"},
		{"every 1m at whole minutes", "@every 1m", "", "2026-01-02T03:04:05Z", "2026-01-02T03:05:00Z"},
		{"every 1m on a tick", "@every 1m", "", "2026-01-02T03:05:00Z", "2026-01-02T03:06:00Z"},
		// 86400 is a multiple of 90, so UTC midnight is a tick of @every 90s.
		{"every 90s from midnight", "@every 90s", "", "2026-01-01T00:00:00Z", "2026-01-01T00:01:30Z"},
		{"every 90s between ticks", "@every 90s", "", "2026-01-01T00:02:00Z", "2026-01-01T00:03:00Z"},
		{"every 90s ignores the time zone", "@every 90s", "Europe/Berlin", "2026-01-01T00:02:00Z", "2026-01-01T00:03:00Z"},
		{"every 1h far future", "@every 1h", "", "2500-06-01T10:30:00Z", "2500-06-01T11:00:00Z"},
		{"every 1s before the epoch", "@every 1s", "", "1900-01-01T00:00:00.25Z", "1900-01-01T00:00:01Z"},
		// Cron in UTC.
		{"cron every 15 minutes", "*/15 * * * *", "", "2026-03-01T10:07:00Z", "2026-03-01T10:15:00Z"},
		{"cron on a tick", "*/15 * * * *", "", "2026-03-01T10:15:00Z", "2026-03-01T10:30:00Z"},
		{"cron sub-second after", "*/15 * * * *", "", "2026-03-01T10:14:59.999Z", "2026-03-01T10:15:00Z"},
		{"cron daily 09:00 UTC", "0 9 * * *", "", "2026-01-15T09:00:00Z", "2026-01-16T09:00:00Z"},
		// Cron in Europe/Berlin: 09:00 local is 08:00Z in winter, 07:00Z in summer.
		{"berlin winter", "0 9 * * *", "Europe/Berlin", "2026-01-15T00:00:00Z", "2026-01-15T08:00:00Z"},
		{"berlin summer", "0 9 * * *", "Europe/Berlin", "2026-07-15T00:00:00Z", "2026-07-15T07:00:00Z"},
		{"berlin after today's tick", "0 9 * * *", "Europe/Berlin", "2026-07-15T07:00:00Z", "2026-07-16T07:00:00Z"},
		// 6 fields, with seconds.
		{"seconds field", "30 * * * * *", "", "2026-03-01T10:00:00Z", "2026-03-01T10:00:30Z"},
		{"seconds field on a tick", "30 * * * * *", "", "2026-03-01T10:00:30Z", "2026-03-01T10:01:30Z"},
		{"every second", "* * * * * *", "", "2026-03-01T10:00:00.3Z", "2026-03-01T10:00:01Z"},
		// Descriptors.
		{"hourly", "@hourly", "", "2026-03-01T10:20:00Z", "2026-03-01T11:00:00Z"},
		{"daily in Berlin", "@daily", "Europe/Berlin", "2026-01-15T12:00:00Z", "2026-01-15T23:00:00Z"},
		{"monthly", "@monthly", "", "2026-02-15T00:00:00Z", "2026-03-01T00:00:00Z"},
		// Rare but valid: the parser alone gives up after five years, and
		// 2100 is not a leap year.
		{"feb 29 across 2100", "0 0 29 2 *", "", "2096-03-01T00:00:00Z", "2104-02-29T00:00:00Z"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.expr, tc.tz)
			got := s.Next(utc(tc.after))
			if want := utc(tc.want); !got.Equal(want) || got.Location() != time.UTC {
				t.Errorf("Next(%s) = %s, want %s (in UTC)", tc.after, got, want)
			}
			if first := s.First(utc(tc.after)); !first.Equal(got) {
				t.Errorf("First = %s, want Next's %s", first, got)
			}
		})
	}
}

func TestParseAnchored(t *testing.T) {
	anchor := utc("2026-01-01T00:00:07Z")
	s, err := ParseAnchored("@every 1m", "", anchor)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Anchor().Equal(anchor) || s.Every() != time.Minute {
		t.Fatalf("Anchor, Every = %s, %s", s.Anchor(), s.Every())
	}
	for _, tc := range []struct{ after, want string }{
		{"2026-01-01T10:00:00Z", "2026-01-01T10:00:07Z"},
		{"2026-01-01T10:00:07Z", "2026-01-01T10:01:07Z"},
		// Ticks before the anchor are anchor - k×D.
		{"2025-12-31T23:58:00Z", "2025-12-31T23:58:07Z"},
		{"2025-12-31T23:59:30Z", "2026-01-01T00:00:07Z"},
	} {
		if got := s.Next(utc(tc.after)); !got.Equal(utc(tc.want)) {
			t.Errorf("Next(%s) = %s, want %s", tc.after, got, tc.want)
		}
	}
	// The anchor does not matter to cron expressions.
	c, err := ParseAnchored("0 * * * *", "", anchor)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Next(utc("2026-01-01T10:20:00Z")), utc("2026-01-01T11:00:00Z"); !got.Equal(want) {
		t.Errorf("cron Next = %s, want %s", got, want)
	}
}

// TestDST shows the daylight saving rules of Spec.Next in America/New_York,
// where on 2024-03-10 clocks jump from 02:00 EST to 03:00 EDT and on
// 2024-11-03 fall back from 02:00 EDT to 01:00 EST.
func TestDST(t *testing.T) {
	tests := []struct {
		name, expr, after, want string
	}{
		// 02:30 does not exist on 2024-03-10: it fires at 03:00 EDT.
		{"daily in the gap", "30 2 * * *", "2024-03-10T05:00:00Z", "2024-03-10T07:00:00Z"},
		{"daily the day after the gap", "30 2 * * *", "2024-03-10T07:00:00Z", "2024-03-11T06:30:00Z"},
		// Hourly goes from 01:00 EST (06:00Z) to 03:00 EDT (07:00Z).
		{"hourly across the gap", "0 * * * *", "2024-03-10T06:00:00Z", "2024-03-10T07:00:00Z"},
		// 02:00, 02:15, 02:30 and 02:45 are skipped: one tick at 03:00 EDT.
		{"quarter-hourly across the gap", "*/15 * * * *", "2024-03-10T06:45:00Z", "2024-03-10T07:00:00Z"},
		{"quarter-hourly after the gap", "*/15 * * * *", "2024-03-10T07:00:00Z", "2024-03-10T07:15:00Z"},
		// 01:30 happens twice on 2024-11-03, and fires at the first.
		{"daily in the overlap, first", "30 1 * * *", "2024-11-03T04:00:00Z", "2024-11-03T05:30:00Z"},
		{"daily in the overlap, not the second", "30 1 * * *", "2024-11-03T05:30:00Z", "2024-11-04T06:30:00Z"},
		{"daily from inside the repeat", "30 1 * * *", "2024-11-03T06:10:00Z", "2024-11-04T06:30:00Z"},
		// Hourly goes from 01:00 EDT (05:00Z) to 02:00 EST (07:00Z).
		{"hourly across the overlap", "0 * * * *", "2024-11-03T05:00:00Z", "2024-11-03T07:00:00Z"},
		{"hourly from inside the repeat", "0 * * * *", "2024-11-03T06:00:00Z", "2024-11-03T07:00:00Z"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.expr, "America/New_York")
			if got := s.Next(utc(tc.after)); !got.Equal(utc(tc.want)) {
				t.Errorf("Next(%s) = %s, want %s", tc.after, got, tc.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{"  */5   * * * * ", "*/5 * * * *"},
		{"0 30 9 * * 1-5", "0 30 9 * * 1-5"},
		{"@hourly", "@hourly"},
		{"@every 60s", "@every 1m"},
		{"@every 5400s", "@every 1h30m"},
		{"@every 1h0m0s", "@every 1h"},
		{"@every 90s", "@every 1m30s"},
		{"@every  2s", "@every 2s"},
		{"@every 1s", "@every 1s"},
	} {
		s := mustParse(t, tc.expr, "")
		if got := s.String(); got != tc.want {
			t.Errorf("Parse(%q).String() = %q, want %q", tc.expr, got, tc.want)
		}
		again := mustParse(t, s.String(), "")
		if again.String() != s.String() {
			t.Errorf("String of reparsed %q = %q", s.String(), again.String())
		}
	}
	if got := mustParse(t, "@daily", "Europe/Berlin").Timezone(); got != "Europe/Berlin" {
		t.Errorf("Timezone = %q", got)
	}
}

func TestParseRefusals(t *testing.T) {
	tests := []struct {
		expr, tz string
		want     []string // substrings of the message
	}{
		{"", "", []string{`invalid schedule "": empty expression`}},
		{"   ", "", []string{"empty expression"}},
		{"61 * * * *", "", []string{`invalid schedule "61 * * * *": end of range (61) above maximum (59)`}},
		{"* * * *", "", []string{`"* * * *"`, "expected 5 to 6 fields"}},
		{"* * * * * * *", "", []string{"expected 5 to 6 fields"}},
		{"@fortnightly", "", []string{`"@fortnightly"`, "unrecognized descriptor"}},
		{"@every 500ms", "", []string{`invalid schedule "@every 500ms": @every 500ms is shorter than 1s`}},
		{"@every 0s", "", []string{"shorter than 1s"}},
		{"@every 1.5s", "", []string{`"@every 1.5s"`, "not a whole number of seconds", "such as 1s or 2s"}},
		{"@every 1h0m0.000001s", "", []string{"not a whole number of seconds", "such as 1h or 1h0m1s"}},
		{"@every -1m", "", []string{"shorter than 1s"}},
		{"@every", "", []string{`want "@every <duration>"`}},
		{"@every 1m 2m", "", []string{`want "@every <duration>"`}},
		{"@every banana", "", []string{`"@every banana"`, "invalid duration"}},
		{"* * * * *", "Mars/Olympus_Mons", []string{`unknown time zone "Mars/Olympus_Mons"`}},
		{"@every 1m", "Nowhere/Else", []string{`unknown time zone "Nowhere/Else"`}},
		{"* * * * *", "Local", []string{`time zone "Local" depends on the node`}},
		{"CRON_TZ=Europe/Berlin 0 9 * * *", "", []string{"time zone prefix is not allowed"}},
		{"TZ=UTC 0 9 * * *", "", []string{"time zone prefix is not allowed"}},
		{"0 0 31 4 *", "", []string{`"0 0 31 4 *": the expression never fires`}},
		{"0 0 30 2 *", "", []string{"never fires"}},
	}
	for _, tc := range tests {
		t.Run(tc.expr+"/"+tc.tz, func(t *testing.T) {
			_, err := Parse(tc.expr, tc.tz)
			if err == nil {
				t.Fatalf("Parse(%q, %q) succeeded", tc.expr, tc.tz)
			}
			if !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("errors.Is(%v, ErrInvalidSpec) = false", err)
			}
			var se *SpecError
			if !errors.As(err, &se) || se.Expr != tc.expr || se.Reason == "" {
				t.Errorf("error %#v is not a *SpecError for %q", err, tc.expr)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestZeroSpec(t *testing.T) {
	var s Spec
	if got := s.Next(utc("2026-01-01T00:00:00Z")); !got.IsZero() {
		t.Errorf("zero Spec Next = %s, want zero", got)
	}
}

var fuzzZones = []string{"", "UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Sao_Paulo", "Asia/Kolkata"}

func FuzzParse(f *testing.F) {
	for _, e := range []string{
		"* * * * *", "*/5 * * * *", "0 9 * * 1-5", "30 0 * * * *", "0 0 29 2 *",
		"@hourly", "@daily", "@every 1s", "@every 90s", "@every 1h30m", "@every 500ms",
		"61 * * * *", "", "@every", "0 30 2 * * *", "0-59/7 1,3 */2 * 0",
	} {
		f.Add(e, uint8(0), int64(1767225600))
		f.Add(e, uint8(3), int64(1710050400)) // 2024-03-10 01:00 EST
	}
	f.Fuzz(func(t *testing.T, expr string, zone uint8, sec int64) {
		tz := fuzzZones[int(zone)%len(fuzzZones)]
		s, err := Parse(expr, tz)
		if err != nil {
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("Parse(%q, %q): error %v is not ErrInvalidSpec", expr, tz, err)
			}
			return
		}
		// Any instant between 1970 and about 2200, with a sub-second part.
		const span = 7_258_118_400 // seconds from 1970 to 2200
		sec %= span
		if sec < 0 {
			sec += span
		}
		after := time.Unix(sec, (sec*7919)%1e9)
		next := s.Next(after)
		if !next.After(after) {
			t.Fatalf("Parse(%q, %q).Next(%s) = %s, not after it", expr, tz, after, next)
		}
		if again, err := Parse(s.String(), tz); err != nil || again.String() != s.String() {
			t.Fatalf("canonical %q of %q does not reparse to itself: %v", s.String(), expr, err)
		}
	})
}
