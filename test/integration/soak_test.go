//go:build soak

// The soak is built only with the soak tag (`make soak`): it takes minutes
// and is not part of CI.

package integration

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// TestSoak: 100,000 probe tasks over four nodes with disjoint buckets,
// while every 10 s a node chosen at random is killed with SIGKILL and
// started again, until the last task is in. FLOTILLA_SOAK_TASKS changes
// the number of tasks. The checks are the scenarios' (verify).
func TestSoak(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	tasks := 100_000
	if s := os.Getenv("FLOTILLA_SOAK_TASKS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("FLOTILLA_SOAK_TASKS=%q is not a positive number", s)
		}
		tasks = n
	}
	const (
		period = 10 * time.Second
		over   = 3 * time.Minute
	)
	nodes := []nodeSpec{
		{id: "s1", buckets: "0-15"},
		{id: "s2", buckets: "16-31"},
		{id: "s3", buckets: "32-47"},
		{id: "s4", buckets: "48-63"},
	}
	r := newRig(t)
	r.schedule()
	for _, s := range nodes {
		r.start(s)
	}
	for _, s := range nodes {
		r.waitUntilHeld(s.id, mustSet(t, s.buckets), startWithin)
	}
	began := time.Now()
	submitted := r.submitInBackground(probeLoad{
		tasks: tasks, minWork: time.Millisecond, maxWork: 100 * time.Millisecond, over: over, batch: 100,
	}, "soak")

	var recoveries []time.Duration
	tick := time.NewTicker(period)
	defer tick.Stop()
kills:
	for {
		select {
		case <-submitted.done:
			break kills
		case <-tick.C:
		}
		recoveries = append(recoveries, r.killAndRestart(nodes, failoverWithin))
	}
	submitted.wait()
	r.waitUntilSettled(tasks, 20*time.Minute)
	took := time.Since(began)
	fig := r.verify()
	t.Logf("figures: scenario=soak nodes=%d kills=%d took=%v throughput=%.0f/s %s",
		len(nodes), len(recoveries), took.Round(time.Second), float64(tasks)/took.Seconds(), fig)
	t.Logf("figures: kill -9 to the restarted node holding its buckets again: %s", describeDurations(recoveries))
}
