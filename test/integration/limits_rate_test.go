package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
)

// TestRatePerKeyHoldsThroughKillNine: three test workers with disjoint
// buckets run probe tasks over limit keys, each key limited by `worker
// limit set` to R starts per period with a burst of B, while holders that
// run tasks are killed with SIGKILL and started again. In the ledger, no
// closed window of one period holds more than R + B starts of one key
// (starts of executions a kill cut short count too), and every task
// succeeds once (rig.verify).
//
// The period is 5s, longer than a restarted node takes to hold its buckets
// again, so that windows span the kills: the starts of the killed holder
// and of its successor count together. The interval between starts, 1s,
// is far above the delay between a node's start of a task and the
// handler's first line, where the ledger's time is taken, on the one
// machine clock every process of the test reads.
func TestRatePerKeyHoldsThroughKillNine(t *testing.T) {
	needsIntegration(t)
	r := newRig(t)
	const (
		keys   = 12
		perKey = 30
		rate   = 5
		period = 5 * time.Second
		burst  = 3
		kills  = 3
	)
	if _, stderr, code := r.cli("limit", "set", "--kind", "probe", "--per", "key",
		"--rate", fmt.Sprintf("%d/%v", rate, period), "--burst", strconv.Itoa(burst), "probe-rate"); code != 0 {
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
	limitKeys := r.limitKeysSpread("rate", keys, threeNodes)
	reqs := make([]flotilla.TaskRequest, 0, keys*perKey)
	for i := range keys * perKey {
		work := 200*time.Millisecond + rand.N(400*time.Millisecond)
		payload, _ := json.Marshal(map[string]string{"duration": work.String()})
		reqs = append(reqs, flotilla.TaskRequest{Kind: "probe", Key: fmt.Sprintf("rate-task-%d", i),
			LimitKey: limitKeys[i%keys], Payload: payload, MaxAttempts: probeMaxAttempts})
	}
	created, err := r.client.SubmitMany(ctx, reqs, flotilla.AllowUnowned())
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range created {
		r.submitted = append(r.submitted, tk.ID)
	}
	recoveries := r.killBusyAndRestart(ctx, threeNodes, kills)
	r.waitUntilSettled(len(reqs), settleWithin)
	fig := r.verify()

	starts := map[string][]time.Time{}
	for _, e := range r.limitedRuns(ctx) {
		starts[e.limitKey] = append(starts[e.limitKey], e.start)
	}
	peak, peakKey := 0, ""
	for _, k := range limitKeys {
		n, at := busiestWindow(starts[k], period)
		if n > rate+burst {
			t.Errorf("%s: %d starts in the %v from %s, want at most %d (rate %d + burst %d)",
				k, n, period, at.Format(time.RFC3339Nano), rate+burst, rate, burst)
		}
		if n > peak {
			peak, peakKey = n, k
		}
	}
	if peak < rate {
		t.Errorf("the busiest key, %s, started %d in one period, fewer than the rate of %d: the load never reached the limit, and the test proved nothing",
			peakKey, peak, rate)
	}
	if fig.rescued == 0 {
		t.Errorf("no task needed a second attempt: the kills hit no running task, and the test proved nothing")
	}
	t.Logf("figures: scenario=limits-rate-per-key tasks=%d keys=%d rate=%d/%v burst=%d kills=%d recoveries=%v busiest_window=%d settled_after=%v %s",
		len(reqs), keys, rate, period, burst, len(recoveries), recoveries, peak, time.Since(began).Round(time.Second), fig)
}
