package integration

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestFleetKindLimitHoldsThroughKillNine: three test workers with disjoint
// buckets run probe tasks spread over every bucket, the kind limited by
// `worker limit set --per fleet` to N running in the whole fleet, while
// three holders, each running tasks, are killed with SIGKILL and started
// again, one after another (the three kills). The
// ledger must show at no instant more than N executions of the kind across
// the three nodes (an execution of the killed process ends when the
// process is gone), and every task must succeed once (rig.verify).
//
// The ledger's times need no allowance for clock skew: a node's execution
// ends before its outcome is written, which is before another node's share
// can grow by that slot, which is before that node's next handler starts.
func TestFleetKindLimitHoldsThroughKillNine(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	r := newRig(t)
	const (
		tasks = 600
		limit = 6
		kills = 3
	)
	if _, stderr, code := r.cli("limit", "set", "--kind", "probe", "--per", "fleet",
		"--concurrency", strconv.Itoa(limit), "probe-fleet"); code != 0 {
		t.Fatalf("worker limit set exited %d: %s", code, stderr)
	}
	ctx, cancel := context.WithTimeout(t.Context(), settleWithin)
	defer cancel()
	for _, s := range threeNodes {
		r.start(s)
	}
	for _, s := range threeNodes {
		r.waitUntilHeld(s.id, mustSet(t, s.buckets), startWithin)
	}
	began := time.Now()
	if err := r.submit(ctx, probeLoad{tasks: tasks, minWork: 100 * time.Millisecond, maxWork: 300 * time.Millisecond,
		batch: tasks}, "fleet"); err != nil {
		t.Fatal(err)
	}
	recoveries := r.killBusyAndRestart(ctx, threeNodes, kills)
	r.waitUntilSettled(tasks, settleWithin)
	fig := r.verify()

	execs := r.limitedRuns(ctx)
	peak, over := peakOverlap(execs, limit)
	if len(over) > 0 {
		t.Errorf("more than %d executions of the kind at once in the fleet (%d times): %v", limit, len(over), over[:min(10, len(over))])
	}
	if peak < limit {
		t.Errorf("the fleet ran at most %d at once, want %d: the load never reached the limit, and the test proved nothing", peak, limit)
	}
	if fig.rescued == 0 {
		t.Errorf("no task needed a second attempt: the kill hit no running task, and the test proved nothing")
	}
	byNode := map[string]int{}
	for _, e := range execs {
		byNode[e.node]++
	}
	for _, s := range threeNodes {
		if byNode[s.id] == 0 {
			t.Errorf("node %s ran no task: the limit was not shared, and the test proved less than it says", s.id)
		}
	}
	t.Logf("figures: scenario=limits-fleet tasks=%d concurrency=%d kills=%d recoveries=%v peak=%d executions_by_node=%v settled_after=%v %s",
		tasks, limit, len(recoveries), recoveries, peak, byNode, time.Since(began).Round(time.Second), fig)
}
