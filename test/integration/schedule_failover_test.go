package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
)

// TestAScheduleFiresOncePerTickAcrossAKill9 is the seed's setup: three
// nodes that all declare every bucket and one schedule every second. One
// node holds the schedule's bucket and fires it; the others stand by. The
// holder is killed with SIGKILL; the node that takes the bucket over
// continues from the stored tick. No tick fires twice, and the only ticks
// that may be missing are those inside the failover window.
func TestAScheduleFiresOncePerTickAcrossAKill9(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	if _, stderr, code := f.cli("schedule", "add", "--every", "1s", "--kind", "noop", "beat"); code != 0 {
		t.Fatalf("schedule add exited %d: %s", code, stderr)
	}
	procs := map[string]*proc{}
	for _, id := range []string{"n1", "n2", "n3"} {
		procs[id] = f.worker("run", "--buckets", "0-63", "--node-id", id, "--bucket-lease-ttl", leaseTTL(2*time.Second).String(), "--no-balance")
	}
	holder := f.scheduleHolder("beat", "")
	f.waitForTicks("beat", 4)

	killedAt := time.Now()
	procs[holder].kill9()
	successor := f.scheduleHolder("beat", holder)
	tookOverAt := time.Now()
	afterTakeover := len(f.ticks("beat"))
	ticks := f.waitForTicks("beat", afterTakeover+4)
	t.Logf("holder %s killed; %s took over the schedule's bucket %.1f s later", holder, successor,
		tookOverAt.Sub(killedAt).Seconds())

	// Every second from the first tick to the last fired once, except
	// perhaps some inside the failover window: the catch-up policy (skip)
	// fires a tick found less than the misfire threshold late, and skips
	// older ones.
	var missing []time.Time
	for at, i := ticks[0], 0; !at.After(ticks[len(ticks)-1]); at = at.Add(time.Second) {
		if i < len(ticks) && ticks[i].Equal(at) {
			i++
			continue
		}
		missing = append(missing, at)
	}
	// A tick due less than the misfire threshold before the kill may not
	// have fired yet (the holder fires late by its poll, and by more on a
	// loaded machine); the successor finds it too late and skips it. The
	// window ends at the successor's first tick: the takeover seen here is
	// the lease's row, and the successor learns of it only when its
	// statement answers, later on a loaded machine; a tick due meanwhile is
	// as late to it as one due before. A tick missing after its first is a
	// gap in a served schedule, and fails the test.
	windowStart, windowEnd := killedAt.Add(-patience.Scale(schedule.DefaultMisfire)), tookOverAt.Add(time.Second)
	for _, at := range ticks {
		if at.After(killedAt) {
			windowEnd = maxTime(windowEnd, at)
			break
		}
	}
	if late := windowEnd.Sub(tookOverAt); late > patience.Scale(5*time.Second) {
		t.Errorf("the successor's first tick (%s) came %v after it took the bucket over", windowEnd.Format(time.RFC3339), late)
	}
	for _, at := range missing {
		if at.Before(windowStart) || at.After(windowEnd) {
			t.Errorf("tick %s is missing, outside the failover window %s to %s", at.Format(time.RFC3339),
				windowStart.Format(time.RFC3339Nano), windowEnd.Format(time.RFC3339Nano))
		}
	}
	t.Logf("%d ticks fired, %d skipped in the failover window", len(ticks), len(missing))

	// Fired tasks carry their schedule and tick, and `worker get` shows them.
	tasks, err := f.list(store.TaskFilter{Schedule: "beat", Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range tasks {
		if tk.Schedule != "beat" || tk.ScheduledFor.IsZero() || tk.Kind != "noop" {
			t.Fatalf("fired task %+v", tk)
		}
	}
	stdout, stderr, code := f.cli("get", fmt.Sprint(tasks[0].ID))
	if code != 0 || !strings.Contains(stdout, "beat at ") {
		t.Errorf("worker get of a fired task exited %d and shows no schedule: %s %s", code, stdout, stderr)
	}
}

// scheduleHolder waits until a node other than not holds the schedule's
// bucket, and returns it.
func (f *fleet) scheduleHolder(name, not string) string {
	f.t.Helper()
	var holder string
	f.waitForScheduleState(name, func(sc flotilla.ScheduleReport) bool {
		holder = sc.Holder
		return holder != "" && holder != not
	})
	return holder
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
