package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// TestScheduleCLIRefusesBadDefinitions checks that `worker schedule add`
// refuses what could never fire, naming the bad value, with exit status 2
// and nothing written; and an existing name with 3 unless --replace.
func TestScheduleCLIRefusesBadDefinitions(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	for _, tc := range []struct {
		args     []string
		code     int
		mentions []string
	}{
		{[]string{"--cron", "61 * * * *", "--kind", "noop", "bad-cron"}, exitInvalid, []string{"61 * * * *", "above maximum"}},
		{[]string{"--every", "500ms", "--kind", "noop", "too-fast"}, exitInvalid, []string{"500ms", "1s"}},
		{[]string{"--every", "1500ms", "--kind", "noop", "fraction"}, exitInvalid, []string{"1.5s", "whole number of seconds"}},
		{[]string{"--kind", "noop", "no-timing"}, exitInvalid, []string{"cron", "every"}},
		{[]string{"--every", "1s", "--cron", "* * * * *", "--kind", "noop", "both"}, exitInvalid, []string{"both"}},
		{[]string{"--every", "1s", "no-kind"}, exitInvalid, []string{"kind"}},
		{[]string{"--every", "1s", "--kind", "noop", "--timezone", "Mars/Olympus", "bad-zone"}, exitInvalid, []string{"Mars/Olympus"}},
		{[]string{"--every", "1s", "--kind", "noop", "--catch-up", "all", "bad-policy"}, exitInvalid, []string{`"all"`, "skip", "latest"}},
		{[]string{"--every", "1s", "--kind", "noop", "--payload", "{x", "bad-payload"}, exitInvalid, []string{"{x", "JSON"}},
		{[]string{"--every", "1s", "--kind", "noop"}, exitInvalid, []string{"NAME"}},
	} {
		stdout, stderr, code := f.cli(append([]string{"schedule", "add"}, tc.args...)...)
		checkOneLineRefusal(t, "schedule add "+strings.Join(tc.args, " "), stdout, stderr, code, tc.code, tc.mentions...)
	}
	if list := f.schedules(); len(list) != 0 {
		t.Fatalf("refused definitions left %d schedules", len(list))
	}

	if _, stderr, code := f.cli("schedule", "add", "--every", "1m", "--kind", "noop", "report"); code != 0 {
		t.Fatalf("schedule add exited %d: %s", code, stderr)
	}
	stdout, stderr, code := f.cli("schedule", "add", "--every", "2m", "--kind", "noop", "report")
	checkOneLineRefusal(t, "schedule add of an existing name", stdout, stderr, code, exitRefused, "report", "--replace")
	if _, stderr, code := f.cli("schedule", "add", "--every", "2m", "--kind", "noop", "--replace", "report"); code != 0 {
		t.Fatalf("schedule add --replace exited %d: %s", code, stderr)
	}
	if list := f.schedules(); len(list) != 1 || list[0].Spec != "@every 2m" {
		t.Fatalf("after --replace: %+v, want one schedule @every 2m", list)
	}
	for _, cmd := range []string{"rm", "pause", "resume"} {
		stdout, stderr, code := f.cli("schedule", cmd, "nope")
		checkOneLineRefusal(t, "schedule "+cmd+" of a missing schedule", stdout, stderr, code, exitNotFound, "nope")
	}
}

// TestScheduleCLILifecycle adds, lists, pauses, resumes and removes a
// schedule through the command line, with one worker firing it.
func TestScheduleCLILifecycle(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	// Added before any node runs: accepted, with a warning.
	if _, stderr, code := f.cli("schedule", "add", "--every", "1s", "--kind", "noop", "--payload", `{"n":1}`, "beat"); code != 0 {
		t.Fatalf("schedule add exited %d: %s", code, stderr)
	} else if want := fmt.Sprintf("no live node holds bucket %d", f.policy.Of("beat")); !strings.Contains(stderr, want) {
		t.Errorf("schedule add with nobody to fire it warned %q, want it to say %q", stderr, want)
	}
	f.worker("run", "--buckets", "0-63", "--node-id", "solo")
	f.waitForTicks("beat", 2)

	var listed []struct {
		Name, Spec, Holder string
		Enabled            bool
		NextFireAt         *string `json:"next_fire_at"`
		LastFireAt         *string `json:"last_fire_at"`
	}
	stdout, stderr, code := f.cli("schedule", "list", "--json")
	if code != 0 {
		t.Fatalf("schedule list exited %d: %s", code, stderr)
	}
	decodeJSON(t, "schedule list --json", stdout, &listed)
	if len(listed) != 1 || listed[0].Holder != "solo" || !listed[0].Enabled || listed[0].LastFireAt == nil {
		t.Fatalf("schedule list --json: %s", stdout)
	}
	// Fired tasks carry their schedule and tick, in list --json too.
	stdout, _, _ = f.cli("list", "--json")
	if !strings.Contains(stdout, `"schedule": "beat"`) || !strings.Contains(stdout, `"scheduled_for": "`) {
		t.Errorf("list --json does not show the schedule and tick of fired tasks: %s", stdout)
	}

	if _, stderr, code := f.cli("schedule", "pause", "beat"); code != 0 {
		t.Fatalf("schedule pause exited %d: %s", code, stderr)
	}
	f.waitForScheduleState("beat", func(sc flotilla.ScheduleReport) bool { return !sc.Enabled })
	// The pause froze the next fire time. Once the database clock is two
	// seconds past it, a schedule still firing would have fired that tick
	// (the holder looks every 250 ms); a paused one has not.
	frozen := f.schedules()[0].NextFireAt
	f.waitForDatabaseClock(frozen.Add(2 * time.Second))
	before := f.ticks("beat")
	if last := before[len(before)-1]; !last.Before(frozen) {
		t.Errorf("a paused schedule fired tick %s (paused before %s)", last.Format(time.RFC3339), frozen.Format(time.RFC3339))
	}
	if _, stderr, code := f.cli("schedule", "resume", "beat"); code != 0 {
		t.Fatalf("schedule resume exited %d: %s", code, stderr)
	}
	f.waitForTicks("beat", len(before)+2)
	if stdout, stderr, code := f.cli("schedule", "rm", "beat"); code != 0 || !strings.Contains(stdout, "removed") {
		t.Fatalf("schedule rm exited %d: %s %s", code, stdout, stderr)
	}
	if list := f.schedules(); len(list) != 0 {
		t.Errorf("after rm: %+v", list)
	}
}

// TestScheduleCLIReplaceKeepsAPause checks that `schedule add --replace`
// leaves a paused schedule paused, with the tick from before the pause not
// fired, and that --resume and --paused with --replace do what they say.
func TestScheduleCLIReplaceKeepsAPause(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	add := func(extra ...string) {
		t.Helper()
		args := append([]string{"schedule", "add", "--every", "1s", "--kind", "noop"}, extra...)
		if _, stderr, code := f.cli(append(args, "beat")...); code != 0 {
			t.Fatalf("%s exited %d: %s", strings.Join(args, " "), code, stderr)
		}
	}
	add()
	if _, stderr, code := f.cli("schedule", "pause", "beat"); code != 0 {
		t.Fatalf("schedule pause exited %d: %s", code, stderr)
	}
	frozen := f.schedules()[0].NextFireAt
	add("--replace", "--payload", `{"v":2}`)
	// A probe in the same bucket shows when the holder fires there: once it
	// has fired a tick a second past the paused one, so would have beat.
	if _, stderr, code := f.cli("schedule", "add", "--every", "1s", "--kind", "noop", "--key", "beat", "probe"); code != 0 {
		t.Fatalf("schedule add probe exited %d: %s", code, stderr)
	}
	f.worker("run", "--buckets", "0-63", "--node-id", "solo")
	for probe := f.waitForTicks("probe", 1); !probe[len(probe)-1].After(frozen.Add(time.Second)); {
		probe = f.waitForTicks("probe", len(probe)+1)
	}
	sc := f.schedule("beat")
	if sc.Enabled || !sc.NextFireAt.Equal(frozen) || !strings.Contains(string(sc.Payload), `"v"`) {
		t.Fatalf("after --replace: enabled %v next %s payload %s, want paused at %s with the new payload",
			sc.Enabled, sc.NextFireAt.Format(time.RFC3339Nano), sc.Payload, frozen.Format(time.RFC3339Nano))
	}
	if got := f.ticks("beat"); len(got) != 0 {
		t.Fatalf("a paused schedule replaced without --resume fired %d ticks, the first %s", len(got), got[0])
	}

	stdout, stderr, code := f.cli("schedule", "add", "--every", "1s", "--kind", "noop", "--replace", "--paused", "--resume", "beat")
	checkOneLineRefusal(t, "schedule add --paused --resume", stdout, stderr, code, exitInvalid, "--paused", "--resume")

	ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
	resumedAt, err := f.client.Store().Now(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	add("--replace", "--resume")
	if !f.schedule("beat").Enabled {
		t.Fatal("after --replace --resume the schedule is still paused")
	}
	ticks := f.waitForTicks("beat", 2)
	if !ticks[0].After(resumedAt) {
		t.Errorf("after --replace --resume the first tick fired is %s, before the resume at %s: a tick of the pause",
			ticks[0].Format(time.RFC3339Nano), resumedAt.Format(time.RFC3339Nano))
	}
	add("--replace", "--paused")
	if f.schedule("beat").Enabled {
		t.Error("after --replace --paused the schedule is still running")
	}
}

// schedule reads one schedule.
func (f *fleet) schedule(name string) store.Schedule {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
	defer cancel()
	sc, err := f.client.Store().GetSchedule(ctx, name)
	if err != nil {
		f.t.Fatalf("schedule %s: %v", name, err)
	}
	return sc
}

// schedules reads every schedule.
func (f *fleet) schedules() []flotilla.ScheduleReport {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
	defer cancel()
	list, err := f.client.Schedules(ctx)
	if err != nil {
		f.t.Fatalf("read schedules: %v", err)
	}
	return list
}

// ticks returns the ticks schedule name fired, ascending, failing the test
// on a tick fired twice.
func (f *fleet) ticks(name string) []time.Time {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
	defer cancel()
	tasks, err := f.client.List(ctx, store.TaskFilter{Schedule: name, Limit: 100000})
	if err != nil {
		f.t.Fatalf("list the tasks of schedule %s: %v", name, err)
	}
	return distinctTicks(f.t, tasks)
}

func distinctTicks(t *testing.T, tasks []*task.Task) []time.Time {
	t.Helper()
	seen := map[time.Time]int64{}
	out := make([]time.Time, 0, len(tasks))
	for _, tk := range tasks {
		if other, dup := seen[tk.ScheduledFor]; dup {
			t.Fatalf("tick %s fired twice: tasks %d and %d", tk.ScheduledFor.Format(time.RFC3339Nano), other, tk.ID)
		}
		seen[tk.ScheduledFor] = tk.ID
		out = append(out, tk.ScheduledFor)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// waitForTicks waits until schedule name has fired at least n ticks.
func (f *fleet) waitForTicks(name string, n int) []time.Time {
	f.t.Helper()
	deadline := time.Now().Add(patience.Scale(taskWithin + time.Duration(n)*time.Second))
	for {
		ticks := f.ticks(name)
		if len(ticks) >= n {
			return ticks
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("schedule %s fired %d ticks, want %d", name, len(ticks), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (f *fleet) waitForScheduleState(name string, cond func(flotilla.ScheduleReport) bool) {
	f.t.Helper()
	deadline := time.Now().Add(patience.Scale(taskWithin))
	for {
		for _, sc := range f.schedules() {
			if sc.Name == name && cond(sc) {
				return
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("schedule %s did not reach the state awaited: %s", name, fmt.Sprint(f.schedules()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitForDatabaseClock waits until the database's clock has passed at.
func (f *fleet) waitForDatabaseClock(at time.Time) {
	f.t.Helper()
	deadline := time.Now().Add(patience.Scale(taskWithin) + time.Until(at))
	for {
		ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
		now, err := f.client.Store().Now(ctx)
		cancel()
		if err != nil {
			f.t.Fatalf("read the database clock: %v", err)
		}
		if now.After(at) {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the database clock did not pass %s", at.Format(time.RFC3339Nano))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
