package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
)

// TestScanOfLooksAtMoreOnlyWhereAKeyCanTurnCandidatesDown: a claim under
// rooms of kinds alone looks at twice what it asks for; one a key's room or
// a resource can turn candidates down at looks at 32 at least.
func TestScanOfLooksAtMoreOnlyWhereAKeyCanTurnCandidatesDown(t *testing.T) {
	fleet := []store.KindRoom{{Kind: "train", Room: 3, KeyRoom: -1}}
	for _, c := range []struct {
		name  string
		lc    store.LimitedClaim
		limit int
		want  int
	}{
		{"kind rooms alone", store.LimitedClaim{Kinds: fleet}, 1, 2},
		{"nothing named", store.LimitedClaim{}, 3, 6},
		{"a key named", store.LimitedClaim{Kinds: fleet, Keys: []store.KeyRoom{{Kind: "train", Key: "a", Room: 1}}}, 1, 32},
		{"keys named with no room of their own", store.LimitedClaim{Kinds: fleet, Keys: []store.KeyRoom{
			{Kind: "train", Key: "a", Room: -1, Used: 1}, {Kind: "train", Key: "b", Room: 0, Used: 2}}}, 1, 2},
		{"a room per key", store.LimitedClaim{Kinds: []store.KindRoom{{Kind: "train", Room: -1, KeyRoom: 2}}}, 1, 32},
		{"resources free", store.LimitedClaim{Kinds: fleet, Free: store.Resources{"gpu": 1}}, 1, 32},
		{"a large claim", store.LimitedClaim{Keys: []store.KeyRoom{{Kind: "train", Key: "a", Room: 1}}}, 100, 200},
		{"past the bound", store.LimitedClaim{}, 6000, 10_000},
		{"set", store.LimitedClaim{Scan: 5}, 100, 5},
	} {
		if got := c.lc.ScanOf(c.limit); got != c.want {
			t.Errorf("%s: ScanOf(%d) = %d, want %d", c.name, c.limit, got, c.want)
		}
	}
}

// TestResourcesAroundSpaces: a list written with spaces after its commas
// names what it says, and a name with spaces around it, which no task's
// name would match, is refused naming it.
func TestResourcesAroundSpaces(t *testing.T) {
	got, err := store.ParseResources("--capacity", "gpu=1, mem = 8")
	if err != nil || len(got) != 2 || got["gpu"] != 1 || got["mem"] != 8 {
		t.Errorf("ParseResources of \"gpu=1, mem = 8\": %v, %v; want gpu=1 and mem=8", got, err)
	}
	err = store.CheckResources("capacity", store.Resources{" mem": 8})
	if err == nil || !strings.Contains(err.Error(), `" mem"`) {
		t.Errorf("a name with a space before it: %v; want it refused, named", err)
	}
}

// TestCheckLimitRefusesARateItCannotCount: a burst whose refill (Burst ×
// Period / Rate) is longer than store.MaxLimitRefill overflowed the holder's
// duration and closed every key for good, and a rate of more than one
// start per MinLimitInterval was rounded down to more starts than asked:
// both are refused, naming the Go field and the bound; the bounds
// themselves are accepted.
func TestCheckLimitRefusesARateItCannotCount(t *testing.T) {
	rate := func(n int, period time.Duration, burst int) store.Limit {
		return store.Limit{Name: "r", Kind: "k", Per: store.PerKey, Rate: n, Period: period, Burst: burst}
	}
	for _, c := range []struct {
		lim   store.Limit
		field string // "" when accepted
		valid string
	}{
		{rate(1, 24*time.Hour, 200_000), "Limit.Burst", "give at most 365"},
		{rate(1, 24*time.Hour, 366), "Limit.Burst", "give at most 365"},
		{rate(1, 24*time.Hour, 365), "", ""},
		{rate(600_000, time.Millisecond, 0), "Limit.Rate", "give at most 1000 per 1ms"},
		{rate(1001, time.Millisecond, 0), "Limit.Rate", "give at most 1000 per 1ms"},
		{rate(1000, time.Millisecond, store.MaxLimitRate), "", ""},
		{rate(store.MaxLimitRate, time.Second, store.MaxLimitRate), "", ""},
	} {
		err := store.CheckLimit(c.lim)
		var inv *store.InvalidError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%v refused: %v", c.lim, err)
		case c.field == "":
		case !errors.As(err, &inv) || inv.Field != c.field || !strings.Contains(inv.Valid, c.valid):
			t.Errorf("%v: %v, want an store.InvalidError on %s saying %q", c.lim, err, c.field, c.valid)
		}
	}
}

// TestRateIntervalsNeverAllowMoreThanAsked: the interval rounds up, and
// the burst window of any limit a store holds fits a duration.
func TestRateIntervalsNeverAllowMoreThanAsked(t *testing.T) {
	for _, l := range []store.Limit{
		{Rate: 3, Period: time.Second},
		{Rate: 600_000, Period: time.Millisecond}, // stored before it was refused
		{Rate: 1, Period: 24 * time.Hour, Burst: 200_000},
		{Rate: store.MaxLimitRate, Period: time.Millisecond, Burst: store.MaxLimitRate},
	} {
		if iv := l.Interval(); time.Duration(l.Rate)*iv < l.Period {
			t.Errorf("%v: interval %v allows %d starts in %v", l, iv, l.Rate+1, l.Period)
		}
		burst, w := l.BurstWindow()
		if burst < 1 || w <= 0 || w > store.MaxLimitRefill {
			t.Errorf("%v: burst %d over %v, want a positive window within %v", l, burst, w, store.MaxLimitRefill)
		}
	}
}
