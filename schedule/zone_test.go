package schedule

import (
	"archive/zip"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The cron ticks of Spec.Next are held against a brute-force reference in
// every zone of the Go zone database over 2024: the reference walks every
// minute of the year, converts it to the zone, and collects the wall clocks
// that match, by the rules Spec.Next documents (a repeated wall clock fires
// at its first occurrence; matching wall clocks skipped by a jump forward
// fire once, at the first instant after the jump).

// sweepSpecs are the expressions of the sweep: daily at noon, daily in the
// small hours where most jumps and repeats fall, weekly, weekly at midnight
// (the hour that jumps in Asia/Beirut and Africa/Cairo), daily at midnight,
// every hour of the small hours, and monthly.
var sweepSpecs = []string{
	"0 12 * * *", "30 2 * * *", "0 12 * * 0", "0 0 * * 5", "0 0 * * *", "0 0-3 * * *", "0 0 1 * *",
}

// The window: the reference walks [walkFrom, walkTo), and ticks are compared
// in [cmpFrom, cmpTo), which holds all of 2024 in every zone (offsets are
// within ±14h) and leaves the reference two days to learn which wall clocks
// it has seen.
var (
	walkFrom = time.Date(2023, 12, 28, 0, 0, 0, 0, time.UTC)
	cmpFrom  = time.Date(2023, 12, 30, 0, 0, 0, 0, time.UTC)
	cmpTo    = time.Date(2025, 1, 2, 0, 0, 0, 0, time.UTC)
	walkTo   = cmpTo
)

// refSpec is a 5-field cron expression of numbers and stars, matched
// without the cron parser.
type refSpec struct {
	expr                    string
	minute, dom, month, dow int   // -1 for *
	hours                   []int // nil for *
}

func parseRef(t testing.TB, expr string) refSpec {
	f := strings.Fields(expr)
	if len(f) != 5 {
		t.Fatalf("reference expression %q: want 5 fields", expr)
	}
	num := func(s string) int {
		if s == "*" {
			return -1
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("reference expression %q: field %q is neither a number nor *", expr, s)
		}
		return n
	}
	r := refSpec{expr: expr, minute: num(f[0]), dom: num(f[2]), month: num(f[3]), dow: num(f[4])}
	if lo, hi, ok := strings.Cut(f[1], "-"); ok {
		for h := num(lo); h <= num(hi); h++ {
			r.hours = append(r.hours, h)
		}
	} else if h := num(f[1]); h >= 0 {
		r.hours = []int{h}
	}
	return r
}

// matches reports whether the wall clock w (seconds since 1970-01-01 00:00
// of the wall clock) matches r. The reference expressions never restrict
// both the day of the month and the day of the week, so both must match.
func (r *refSpec) matches(w int64) bool {
	if w%60 != 0 {
		return false
	}
	if r.minute >= 0 && int(w/60%60) != r.minute {
		return false
	}
	if r.hours != nil && !slices.Contains(r.hours, int(w/3600%24)) {
		return false
	}
	days := w / 86400
	if r.dow >= 0 && int((days+4)%7) != r.dow { // 1970-01-01 was a Thursday
		return false
	}
	if r.dom >= 0 || r.month >= 0 {
		d := time.Unix(days*86400, 0).UTC()
		if (r.dom >= 0 && d.Day() != r.dom) || (r.month >= 0 && int(d.Month()) != r.month) {
			return false
		}
	}
	return true
}

// referenceTicks walks every minute of [walkFrom, walkTo) in loc and returns,
// for each spec, its ticks in [cmpFrom, cmpTo). The offset of each minute
// comes from the zone period holding it; a wall clock that goes forward by
// more than a minute from one minute to the next is a jump, and one that
// does not move forward a repeat.
func referenceTicks(t testing.TB, loc *time.Location, specs []refSpec) [][]time.Time {
	out := make([][]time.Time, len(specs))
	seen := make([]map[int64]bool, len(specs)) // matching wall clocks already fired
	for i := range seen {
		seen[i] = map[int64]bool{}
	}
	var prevWall int64
	first := true
	gapHit := make([]bool, len(specs))
	// The minutes of the hour and the hours any expression names, as bit
	// sets: the other minutes are passed over without matching every
	// expression.
	var minutes, hours uint64
	for _, r := range specs {
		for mi := range 60 {
			if r.minute < 0 || r.minute == mi {
				minutes |= 1 << mi
			}
		}
		for h := range 24 {
			if r.hours == nil || slices.Contains(r.hours, h) {
				hours |= 1 << h
			}
		}
	}
	for from := walkFrom; from.Before(walkTo); {
		lt := from.In(loc)
		_, off := lt.Zone()
		_, end := lt.ZoneBounds()
		if end.IsZero() || end.After(walkTo) {
			end = walkTo
		} else if end.Unix()%60 != 0 {
			t.Fatalf("%s: an offset change at %s, not on a whole minute: the minute walk cannot follow it", loc, end)
		}
		if _, o := time.Unix(end.Unix()-60, 0).In(loc).Zone(); o != off {
			t.Fatalf("%s: the offset of the last minute before %s is %d, not the period's %d", loc, end, o, off)
		}
		off64, last := int64(off), end.Unix()
		for m := from.Unix(); m < last; m += 60 {
			wall := m + off64
			jumped := !first && wall > prevWall+60
			if !jumped && (minutes&(1<<uint(wall/60%60)) == 0 || hours&(1<<uint(wall/3600%24)) == 0) {
				first, prevWall = false, wall
				continue
			}
			clear(gapHit)
			if jumped {
				// A jump forward: the skipped wall clocks fire now.
				for g := prevWall + 60; g < wall; g += 60 {
					for i := range specs {
						if specs[i].matches(g) && !seen[i][g] {
							seen[i][g], gapHit[i] = true, true
						}
					}
				}
			}
			first, prevWall = false, wall
			for i := range specs {
				hit := gapHit[i]
				if specs[i].matches(wall) && !seen[i][wall] {
					seen[i][wall], hit = true, true
				}
				if hit && m >= cmpFrom.Unix() && m < cmpTo.Unix() {
					out[i] = append(out[i], time.Unix(m, 0).UTC())
				}
			}
		}
		from = end
	}
	return out
}

// specTicks returns the ticks of s in [cmpFrom, cmpTo), following Next.
func specTicks(s Spec) []time.Time {
	var out []time.Time
	for at := s.Next(cmpFrom.Add(-time.Nanosecond)); !at.IsZero() && at.Before(cmpTo); at = s.Next(at) {
		out = append(out, at)
	}
	return out
}

// zoneNames lists every zone of the Go zone database, the names in the
// zoneinfo.zip of the Go installation that runs the tests (which is also the
// database time/tzdata embeds), grouped by content: names whose data are
// the same bytes ("US/Eastern" and "America/New_York") are one zone, tried
// once under its first name.
func zoneNames(t testing.TB) [][]string {
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	zipPath := filepath.Join(strings.TrimSpace(string(goroot)), "lib", "time", "zoneinfo.zip")
	r, err := zip.OpenReader(zipPath)
	if err != nil {
		t.Fatalf("the Go zone database: %v", err)
	}
	defer r.Close()
	type content struct {
		crc  uint32
		size uint64
	}
	index := map[content]int{}
	var zones [][]string
	for _, f := range r.File {
		if strings.HasSuffix(f.Name, "/") {
			continue
		}
		c := content{f.CRC32, f.UncompressedSize64}
		if i, ok := index[c]; ok {
			zones[i] = append(zones[i], f.Name)
			continue
		}
		index[c] = len(zones)
		zones = append(zones, []string{f.Name})
	}
	if len(r.File) < 400 {
		t.Fatalf("%s holds %d zones; the database has about 600", zipPath, len(r.File))
	}
	return zones
}

// notable zones are always in the sample of -short: jumps at midnight, a
// half-hour jump, the southern hemisphere, no daylight saving time, and
// the zones of the reports.
var notable = []string{
	"Asia/Beirut", "Africa/Cairo", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe",
	"America/Sao_Paulo", "Pacific/Chatham", "Asia/Kolkata", "America/Havana", "America/Santiago",
	"Asia/Tehran", "Europe/Dublin", "UTC",
}

func TestTicksInEveryZoneMatchTheWallClock(t *testing.T) {
	zones := zoneNames(t)
	if testing.Short() {
		// A sample: every tenth zone, and the notable ones.
		var sample [][]string
		for i, names := range zones {
			if i%10 == 0 || slices.ContainsFunc(names, func(n string) bool { return slices.Contains(notable, n) }) {
				sample = append(sample, names)
			}
		}
		zones = sample
	}
	refs := make([]refSpec, len(sweepSpecs))
	for i, e := range sweepSpecs {
		refs[i] = parseRef(t, e)
	}
	for _, names := range zones {
		name := names[0]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			loc, err := time.LoadLocation(name)
			if err != nil {
				t.Fatal(err)
			}
			want := referenceTicks(t, loc, refs)
			rng := rand.New(rand.NewPCG(uint64(len(name)), uint64(name[0])))
			for i, expr := range sweepSpecs {
				s := mustParse(t, expr, name)
				got := specTicks(s)
				if !slices.EqualFunc(got, want[i], time.Time.Equal) {
					t.Errorf("%q in %s: %s", expr, strings.Join(names, ", "), tickDiff(got, want[i], loc))
					continue
				}
				// Next from any instant, not only from a tick: just
				// before and at each tick, and at random instants.
				probe := func(after time.Time) {
					j, _ := slices.BinarySearchFunc(want[i], after, func(a, b time.Time) int {
						if a.After(b) {
							return 0 // first tick strictly after after
						}
						return -1
					})
					if j == len(want[i]) {
						return
					}
					if n := s.Next(after); !n.Equal(want[i][j]) {
						t.Errorf("%q: Next(%s) = %s, want %s", expr, after.In(loc), n.In(loc), want[i][j].In(loc))
					}
				}
				for k, tick := range want[i] {
					if k%7 == 0 {
						probe(tick.Add(-time.Second))
						probe(tick)
					}
				}
				span := cmpTo.Sub(cmpFrom)
				for range 50 {
					probe(cmpFrom.Add(time.Duration(rng.Int64N(int64(span)))))
				}
			}
		})
	}
}

// tickDiff describes the first difference of two tick lists.
func tickDiff(got, want []time.Time, loc *time.Location) string {
	for i := range min(len(got), len(want)) {
		if !got[i].Equal(want[i]) {
			return fmt.Sprintf("tick %d is %s, want %s (%d ticks, want %d)", i, got[i].In(loc), want[i].In(loc),
				len(got), len(want))
		}
	}
	return fmt.Sprintf("%d ticks, want %d", len(got), len(want))
}

// Daylight saving time starts at midnight in Asia/Beirut and Africa/Cairo:
// the wall clock jumps from 00:00 to 01:00. Noon of that day exists and
// fires; the day's midnight does not exist and fires at 01:00.
func TestTicksOnADayThatStartsAtOne(t *testing.T) {
	tests := []struct {
		name, expr, tz, after, want string
	}{
		// Sunday 2024-03-31: clocks jump at 00:00 (22:00Z on the 30th).
		{"Beirut Sunday noon", "0 12 * * 0", "Asia/Beirut", "2024-03-30T12:00:00Z", "2024-03-31T09:00:00Z"},
		{"Beirut midnight", "0 0 * * *", "Asia/Beirut", "2024-03-30T12:00:00Z", "2024-03-30T22:00:00Z"},
		{"Beirut the day after", "0 12 * * *", "Asia/Beirut", "2024-03-31T09:00:00Z", "2024-04-01T09:00:00Z"},
		// Friday 2024-04-26: clocks jump at 00:00 (22:00Z on the 25th).
		{"Cairo Friday noon", "0 12 * * 5", "Africa/Cairo", "2024-04-25T12:00:00Z", "2024-04-26T09:00:00Z"},
		{"Cairo Friday midnight", "0 0 * * 5", "Africa/Cairo", "2024-04-25T12:00:00Z", "2024-04-25T22:00:00Z"},
		{"Cairo the Friday after", "0 12 * * 5", "Africa/Cairo", "2024-04-26T09:00:00Z", "2024-05-03T09:00:00Z"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.expr, tc.tz)
			if got := s.Next(utc(tc.after)); !got.Equal(utc(tc.want)) {
				t.Errorf("Next(%s) = %s, want %s", tc.after, got, tc.want)
			}
		})
	}
}
