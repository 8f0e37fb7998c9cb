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
	t.Parallel()
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

	runs := map[string][]limitedRun{}
	for _, e := range r.limitedRuns(ctx) {
		runs[e.limitKey] = append(runs[e.limitKey], e)
	}
	peak, peakKey := 0, ""
	for _, k := range limitKeys {
		w := busiestWindow(runs[k], period)
		n := len(w)
		if n > rate+burst {
			t.Errorf("%s: %d starts in one window of %v, want at most %d (rate %d + burst %d): %s",
				k, n, period, rate+burst, rate, burst, describeStarts(w))
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

// TestRateLimitNewHolderStartsWithNoBurst: a holder spends the burst of
// its rate-limited keys and is killed with SIGKILL at once; the node,
// started again, takes the keys over well within one period. The new
// holder must start each key with no tokens and fill at the limit's rate
// (design §8a), so that the old holder's burst and the new holder's starts
// together stay within R + B in every window of one period. A new holder
// that started with a full burst would put 2B starts in the period.
func TestRateLimitNewHolderStartsWithNoBurst(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	r := newRig(t)
	const (
		keys   = 4
		perKey = 6
		rate   = 2
		period = 10 * time.Second
		burst  = 4
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
	// Every key in the buckets of the node that will be killed.
	holder := threeNodes[0]
	limitKeys := r.limitKeysSpread("takeover", keys, []nodeSpec{holder})
	reqs := make([]flotilla.TaskRequest, 0, keys*perKey)
	for i := range keys * perKey {
		payload, _ := json.Marshal(map[string]string{"duration": (50 * time.Millisecond).String()})
		reqs = append(reqs, flotilla.TaskRequest{Kind: "probe", Key: fmt.Sprintf("takeover-task-%d", i),
			LimitKey: limitKeys[i%keys], Payload: payload, MaxAttempts: probeMaxAttempts})
	}
	created, err := r.client.SubmitMany(ctx, reqs, flotilla.AllowUnowned())
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range created {
		r.submitted = append(r.submitted, tk.ID)
	}
	// The holder has spent every key's burst: kill it.
	eventually(t, taskWithin, "every key's burst started", func() bool {
		qctx, cancel := context.WithTimeout(ctx, queryTimeout)
		defer cancel()
		var spent int
		err := r.pool.QueryRow(qctx, `
SELECT count(*) FROM (
    SELECT t.limit_key FROM probe_ledger l JOIN flotilla_tasks t ON t.id = l.task_id
    GROUP BY t.limit_key HAVING count(*) >= $1) k`, burst).Scan(&spent)
		return err == nil && spent == keys
	})
	killed := r.kill9(holder.id)
	r.waitUntilGone(holder.id)
	r.start(holder)
	r.waitUntilHeldByLiveProcess(ctx, holder)
	recovery := time.Since(killed)
	if recovery >= period {
		t.Logf("the takeover took %v, not less than the period of %v: the new holder's burst could not have overlapped the old one's", recovery, period)
	}
	r.waitUntilSettled(len(reqs), settleWithin)
	fig := r.verify()

	runs := map[string][]limitedRun{}
	for _, e := range r.limitedRuns(ctx) {
		runs[e.limitKey] = append(runs[e.limitKey], e)
	}
	peak := 0
	for _, k := range limitKeys {
		w := busiestWindow(runs[k], period)
		n := len(w)
		if n > rate+burst {
			t.Errorf("%s: %d starts in one window of %v, want at most %d (rate %d + burst %d): the new holder added to the old one's burst: %s",
				k, n, period, rate+burst, rate, burst, describeStarts(w))
		}
		peak = max(peak, n)
	}
	t.Logf("figures: scenario=limits-rate-takeover tasks=%d keys=%d rate=%d/%v burst=%d takeover=%v busiest_window=%d %s",
		len(reqs), keys, rate, period, burst, recovery.Round(time.Millisecond), peak, fig)
}
