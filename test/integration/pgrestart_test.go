package integration

import (
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// TestFaultPostgresRestart restarts the PostgreSQL server under a working
// fleet. The server is the test's own (testdb.StartServer), so that the
// restart breaks no connection but the fleet's: the test runs beside the
// others.
func TestFaultPostgresRestart(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	needsPostgres(t)
	server := testdb.StartServer(t)
	r := newRigOn(t, newFleetOn(t, server.New(t)))
	r.schedule()
	a := nodeSpec{id: "a", buckets: "0-31"}
	b := nodeSpec{id: "b", buckets: "32-63"}
	r.startHolding(a)
	r.startHolding(b)

	const tasks = 3_000
	submitted := r.submitInBackground(probeLoad{
		tasks: tasks, minWork: 20 * time.Millisecond, maxWork: 500 * time.Millisecond, over: 20 * time.Second, batch: 50,
	}, "restart")
	r.waitUntilRunning("a", 5)
	r.waitUntilRunning("b", 5)

	restartedAt := time.Now()
	server.Restart()
	restartTook := time.Since(restartedAt)
	// Both nodes are back: they hold their buckets again, renewed after
	// the restart.
	r.waitUntilHeld("a", mustSet(t, a.buckets), failoverWithin)
	r.waitUntilHeld("b", mustSet(t, b.buckets), failoverWithin)
	r.waitForRenewal("a", mustSet(t, a.buckets))
	r.waitForRenewal("b", mustSet(t, b.buckets))
	back := time.Since(restartedAt)
	r.fault(restartedAt, time.Now())
	for _, id := range []string{"a", "b"} {
		if r.rigNode(id).proc.exited() {
			t.Fatalf("node %s exited across the restart", id)
		}
	}

	submitted.wait()
	r.waitUntilSettled(tasks, settleWithin)
	fig := r.verify()
	t.Logf("figures: scenario=postgres-restart restart_took=%v nodes_serving_again_after=%v %s",
		restartTook.Round(time.Millisecond), back.Round(time.Millisecond), fig)
}
