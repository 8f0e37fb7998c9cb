package schedule

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
)

func TestResolve(t *testing.T) {
	policy, err := bucket.NewPolicy(64)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 1, 10, 0, 30, 0, time.UTC)
	sc, err := Definition{Name: "nightly", Cron: "0 3 * * *", Timezone: "Europe/Paris", Kind: "report",
		Payload: json.RawMessage(`{"a":1}`)}.Resolve(policy, now)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Key != "nightly" || sc.Bucket != policy.Of("nightly") || sc.CatchUp != Skip || !sc.Enabled {
		t.Errorf("resolved %+v: want key and bucket of the name, skip, enabled", sc)
	}
	// 03:00 in Paris on 2 January 2030 is 02:00 UTC.
	if want := time.Date(2030, 1, 2, 2, 0, 0, 0, time.UTC); !sc.NextFireAt.Equal(want) {
		t.Errorf("first tick %v, want %v", sc.NextFireAt, want)
	}
	every, err := Definition{Name: "beat", Every: 90 * time.Second, Key: "k", Kind: "noop", CatchUp: Latest,
		Paused: true}.Resolve(policy, now)
	if err != nil {
		t.Fatal(err)
	}
	if every.Spec != "@every 1m30s" || every.Bucket != policy.Of("k") || every.Enabled || every.CatchUp != Latest {
		t.Errorf("resolved %+v", every)
	}
	if want := time.Date(2030, 1, 1, 10, 1, 30, 0, time.UTC); !every.NextFireAt.Equal(want) {
		t.Errorf("first tick %v, want %v (anchored at the Unix epoch)", every.NextFireAt, want)
	}
}

func TestResolveRefusesWhatCannotFire(t *testing.T) {
	policy, _ := bucket.NewPolicy(64)
	ok := Definition{Name: "n", Every: time.Second, Kind: "noop"}
	for _, tc := range []struct {
		name    string
		change  func(*Definition)
		want    error
		mention string
	}{
		{"no name", func(d *Definition) { d.Name = " " }, ErrInvalidDefinition, "name is empty"},
		{"no timing", func(d *Definition) { d.Every = 0 }, ErrInvalidDefinition, "no timing"},
		{"both timings", func(d *Definition) { d.Cron = "* * * * *" }, ErrInvalidDefinition, "both"},
		{"under a second", func(d *Definition) { d.Every = 500 * time.Millisecond }, ErrInvalidDefinition, "500ms"},
		// An hour / 7 is 8m34.285714285s: its ticks would be stored to the
		// microsecond, earlier than computed, and never advance.
		{"a seventh of an hour", func(d *Definition) { d.Every = time.Hour / 7 }, ErrInvalidDefinition,
			"period 8m34.285714285s is not a whole number of seconds: give whole seconds, such as 8m34s or 8m35s"},
		{"a second and a half", func(d *Definition) { d.Every = 1500 * time.Millisecond }, ErrInvalidDefinition, "1.5s"},
		{"whole seconds in the cron field", func(d *Definition) { d.Every, d.Cron = 0, "@every 90.5s" }, ErrInvalidSpec,
			"not a whole number of seconds"},
		{"bad cron", func(d *Definition) { d.Every, d.Cron = 0, "61 * * * *" }, ErrInvalidSpec, "61 * * * *"},
		{"bad zone", func(d *Definition) { d.Timezone = "Mars/Olympus" }, ErrInvalidSpec, "Mars/Olympus"},
		{"no kind", func(d *Definition) { d.Kind = "" }, ErrInvalidDefinition, "kind"},
		{"bad policy", func(d *Definition) { d.CatchUp = "all" }, ErrInvalidDefinition, `"all"`},
		{"bad payload", func(d *Definition) { d.Payload = json.RawMessage(`{x`) }, ErrInvalidDefinition, "{x"},
		{"negative attempts", func(d *Definition) { d.MaxAttempts = -1 }, ErrInvalidDefinition, "-1"},
		{"negative timeout", func(d *Definition) { d.Timeout = -time.Second }, ErrInvalidDefinition, "-1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ok
			tc.change(&d)
			_, err := d.Resolve(policy, time.Now())
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("Resolve: %v, want %v naming %q", err, tc.want, tc.mention)
			}
		})
	}
}
