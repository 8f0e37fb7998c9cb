package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/tcpproxy"
)

// The fault scenarios of issue 6 (see rig_test.go for the rig and
// verify_test.go for the checks each ends with). Their figures are logged
// as "figures:" lines and tabulated in docs/reliability.md.

// threeNodes splits the fleet's 64 buckets between three nodes.
var threeNodes = []nodeSpec{
	{id: "n1", buckets: "0-20"},
	{id: "n2", buckets: "21-41"},
	{id: "n3", buckets: "42-63"},
}

// TestFaultKillNineAndRestart: three nodes with disjoint buckets work
// through 20,000 probe tasks while, every 5 s for 60 s, one of them chosen
// at random is killed with SIGKILL and started again under its node id.
// Each bucket has one holder, so a killed node's buckets wait until its
// leases expire and its next process takes them, under new epochs, and
// rescues the tasks it left running. Nothing may be lost, run twice at
// once, or succeed twice.
func TestFaultKillNineAndRestart(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	r := newRig(t)
	r.schedule()
	const (
		tasks  = 20_000
		period = 5 * time.Second
		run    = 60 * time.Second
	)
	for _, s := range threeNodes {
		r.start(s)
	}
	for _, s := range threeNodes {
		r.waitUntilHeld(s.id, mustSet(t, s.buckets), startWithin)
	}
	began := time.Now()
	submitted := r.submitInBackground(probeLoad{
		tasks: tasks, minWork: 5 * time.Millisecond, maxWork: 150 * time.Millisecond,
		over: run - 10*time.Second, batch: 40,
	}, "kill")

	var recoveries []time.Duration
	tick := time.NewTicker(period)
	defer tick.Stop()
	for time.Since(began) < run {
		<-tick.C
		recoveries = append(recoveries, r.killAndRestart(threeNodes, failoverWithin))
	}
	submitted.wait()
	r.waitUntilSettled(tasks, settleWithin)
	fig := r.verify()
	t.Logf("figures: scenario=kill-9 nodes=3 kills=%d run=%v settled_after=%v %s",
		len(recoveries), run, time.Since(began).Round(time.Second), fig)
	t.Logf("figures: kill -9 to the restarted node holding its buckets again: %s (bucket lease TTL %v)",
		describeDurations(recoveries), r.leaseTTL)
	if fig.rescued == 0 {
		t.Errorf("no task needed a second attempt: the kills hit no running task, and the scenario proved nothing")
	}
}

// TestFaultFrozenHolder: a holder frozen with SIGSTOP past its leases, as
// in a long pause of the process or the machine. A standby that declares
// the same buckets takes them over; the frozen node's executions that go
// on after it is resumed are fenced (the database no longer counts them
// current, and no write of theirs lands); once awake it steps down and
// stands by.
func TestFaultFrozenHolder(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	r := newRig(t)
	r.schedule()
	low := mustSet(t, "0-31")
	holder := nodeSpec{id: "holder", buckets: "0-31", http: true}
	r.startHolding(holder)
	r.startHolding(nodeSpec{id: "other", buckets: "32-63"})
	r.startStandby(nodeSpec{id: "standby", buckets: "0-31"})

	const tasks = 2_000
	submitted := r.submitInBackground(probeLoad{
		tasks: tasks, minWork: 100 * time.Millisecond, maxWork: 2 * time.Second, over: 20 * time.Second, batch: 100,
	}, "frozen")
	r.waitUntilRunning("holder", 5)

	frozeAt := r.freeze("holder")
	r.waitUntilHeld("standby", low, failoverWithin)
	takeover := time.Since(frozeAt)
	// The standby must start again some of the tasks the holder was
	// running when it froze, so that the holder wakes into a fleet that has
	// moved on without it, with its own attempts of those tasks superseded.
	// A rescued task retries behind the backlog submitted before its
	// rescue, which the standby works through first: the wait is for that
	// backlog (longer on a loaded machine), not for the takeover, hence the
	// settling deadline. The ledger keeps the start, so a rescued task that
	// the standby ran and finished between two looks still counts.
	eventually(t, settleWithin, "the standby starts a task the frozen holder was running", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), queryTimeout)
		defer cancel()
		var n int
		err := r.pool.QueryRow(ctx, `
SELECT count(*) FROM probe_ledger s
WHERE s.node = 'standby'
  AND EXISTS (SELECT 1 FROM probe_ledger h WHERE h.task_id = s.task_id AND h.node = 'holder' AND h.ended_at IS NULL)`).
			Scan(&n)
		return err == nil && n > 0
	})
	thawedAt := r.thaw("holder")
	r.fault(frozeAt, thawedAt.Add(r.leaseTTL))

	// Awake, it finds its deadline passed or its buckets taken, stops
	// using them and stands by, alive and ready. (It cannot log while
	// frozen, so a line dated after the freeze was written awake.)
	hp := r.rigNode("holder").proc
	eventually(t, failoverWithin, "the woken holder logs that it stopped using its buckets", func() bool {
		for _, msg := range []string{"bucket lease deadline passed", "bucket leases lost to another node"} {
			for _, l := range logLinesOf(hp, msg) {
				if logTime(l).After(frozeAt) {
					return true
				}
			}
		}
		return false
	})
	r.waitUntilStandingBy("holder", low)
	if hp.exited() {
		t.Fatalf("the woken holder exited")
	}
	// Ready again once its first renewal since waking is answered, as a
	// standby: holding nothing, waiting for the 32 buckets.
	var health healthReport
	if !poll(failoverWithin, func() bool {
		health = r.readyz("holder")
		return health.ready
	}) {
		t.Fatalf("after %v the woken holder is not ready: %+v", failoverWithin, health)
	}
	if health.Held != "" || health.Standby != low.Len() {
		t.Errorf("the woken holder's /readyz: %+v; want it holding nothing, standing by for %d buckets", health, low.Len())
	}

	submitted.wait()
	r.waitUntilSettled(tasks, settleWithin)
	fig := r.verify()
	// No write of the holder's landed after the freeze: every event since
	// is another node's. A statement sent just before SIGSTOP may carry a
	// later database time, hence the second of slack.
	late := r.queryInts(context.Background(), `
SELECT task_id FROM flotilla_task_events WHERE node = 'holder' AND at > $1 ORDER BY task_id`,
		frozeAt.Add(time.Second))
	if len(late) > 0 {
		t.Errorf("%d events were written by the holder after it froze, e.g. tasks %v", len(late), head(late))
	}
	if fig.lateFenced == 0 {
		t.Errorf("no execution of the frozen holder went on past its successor's start: the scenario did not test fencing")
	}
	t.Logf("figures: scenario=sigstop frozen_for=%v takeover_after_freeze=%v fenced_log_lines=%d %s",
		thawedAt.Sub(frozeAt).Round(time.Millisecond), takeover.Round(time.Millisecond),
		len(logLinesOf(hp, "fenced")), fig)
}

// TestFaultPartition: a node connected to PostgreSQL through a proxy. Over
// a slow link, and cut off for less than its bucket lease TTL, it keeps
// serving and stops nothing: a renewal that fails is not a lost lease.
// Partitioned for longer (a black hole: its statements hang rather than
// fail), it stops claiming at its local deadline, before the lease can
// expire in the database, its standby takes over, and once the partition
// heals it rejoins as a standby.
func TestFaultPartition(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	r := newRig(t)
	r.schedule()
	proxy, err := tcpproxy.New(hostOf(t, r.dsn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() }) // after the workers are killed
	r.proxyDSN = withHost(t, r.dsn, proxy.Addr())
	low := mustSet(t, "0-31")
	r.startHolding(nodeSpec{id: "cutoff", buckets: "0-31", viaProxy: true})
	r.startHolding(nodeSpec{id: "other", buckets: "32-63"})
	r.startStandby(nodeSpec{id: "standby", buckets: "0-31"})

	const tasks = 3_000
	submitted := r.submitInBackground(probeLoad{
		tasks: tasks, minWork: 50 * time.Millisecond, maxWork: 1500 * time.Millisecond, over: 30 * time.Second, batch: 100,
	}, "cut")
	r.waitUntilRunning("cutoff", 5)
	cp := r.rigNode("cutoff").proc

	// A slow link: every chunk held for 30 ms each way, over two renewals.
	const lag = 30 * time.Millisecond
	epochsBefore := r.waitForRenewal("cutoff", low)
	proxy.Delay(lag)
	r.waitForRenewal("cutoff", low)
	r.waitForRenewal("cutoff", low)
	proxy.Delay(0)

	// A short cut: half a TTL, begun just after a renewal, so that the
	// next renewal fails and the one after succeeds.
	short := r.leaseTTL / 2
	r.waitForRenewal("cutoff", low)
	cutAt := time.Now()
	proxy.Cut()
	watch := time.NewTicker(pollInterval)
	for time.Since(cutAt) < short {
		// An observation window: nobody else may get the buckets.
		<-watch.C
		bs := r.mustBuckets()
		if heldBy(bs, low, "cutoff") != low.Len() {
			t.Fatalf("during a cut of %v, buckets 0-31 changed hands: %s", short, describeHolders(bs))
		}
	}
	watch.Stop()
	proxy.Heal()
	healedAt := time.Now()
	// Its next renewal goes through, under the same epochs.
	epochsAfter := r.waitForRenewal("cutoff", low)
	for b, e := range epochsBefore {
		if epochsAfter[b] != e {
			t.Errorf("bucket %d: epoch %d before the slow link and the short cut, %d after; want it kept", b, e, epochsAfter[b])
		}
	}
	for _, msg := range []string{"bucket lease deadline passed", "bucket leases lost", "cancelling handler"} {
		if ls := logLinesOf(cp, msg); len(ls) > 0 {
			t.Errorf("over a slow link and a cut of %v the node logged %q: it stopped something", short, msg)
		}
	}
	interrupted := r.queryInts(context.Background(),
		`SELECT task_id FROM probe_ledger WHERE node = 'cutoff' AND outcome LIKE 'interrupted%' ORDER BY task_id`)
	if len(interrupted) > 0 {
		t.Errorf("a slow link and a cut of %v interrupted %d executions of the cut-off node, e.g. %v", short, len(interrupted), head(interrupted))
	}
	failedRenewals := len(logLinesOf(cp, "bucket lease renewal failed"))
	if failedRenewals == 0 {
		t.Errorf("no renewal failed during the cut of %v: the short cut tested nothing", short)
	}

	// A long partition, until the standby has taken over and runs tasks:
	// a black hole, in which statements hang instead of failing, so that
	// only the node's own deadline timer can stop it in time.
	r.waitUntilRunning("cutoff", 3)
	longAt := time.Now()
	proxy.Blackhole()
	r.waitUntilHeld("standby", low, failoverWithin)
	takeover := time.Since(longAt)
	r.waitUntilRunning("standby", 1)
	var stepDown time.Time
	eventually(t, failoverWithin, "the cut-off node logs that its deadline passed", func() bool {
		for _, l := range logLinesOf(cp, "bucket lease deadline passed") {
			if logTime(l).After(longAt) {
				stepDown = logTime(l)
				return true
			}
		}
		return false
	})
	proxy.Heal()
	longHealed := time.Now()
	r.fault(cutAt, healedAt)
	r.fault(longAt, longHealed.Add(r.leaseTTL))
	// It stopped at its local deadline: before TTL had passed since the
	// partition (its last renewal was sent before it), and it started
	// nothing after.
	if d := stepDown.Sub(longAt); d > r.leaseTTL {
		t.Errorf("the cut-off node stepped down %v after the partition, later than its TTL %v", d, r.leaseTTL)
	}
	startedLate := r.queryInts(context.Background(), `
SELECT task_id FROM probe_ledger WHERE node = 'cutoff' AND started_at > $1 AND started_at < $2 ORDER BY task_id`,
		stepDown, longHealed)
	if len(startedLate) > 0 {
		t.Errorf("the cut-off node started %d executions after its deadline, e.g. %v", len(startedLate), head(startedLate))
	}
	r.waitUntilStandingBy("cutoff", low)
	if cp.exited() {
		t.Fatal("the cut-off node exited")
	}

	submitted.wait()
	r.waitUntilSettled(tasks, settleWithin)
	fig := r.verify()
	t.Logf("figures: scenario=partition slow_link=%v short_cut=%v failed_renewals=%d long_blackhole=%v step_down_after_partition=%v takeover_after_partition=%v %s",
		lag, short, failedRenewals, longHealed.Sub(longAt).Round(time.Millisecond), stepDown.Sub(longAt).Round(time.Millisecond),
		takeover.Round(time.Millisecond), fig)
}

// TestFaultSigtermUnderLoad: a holder stopped gracefully while it runs
// tasks. Handlers that finish within the shutdown timeout finish; the
// others are released (running -> queued, the attempt not counted); the
// leases are released and announced, and the standby takes over at once.
func TestFaultSigtermUnderLoad(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	r := newRig(t)
	r.schedule()
	low := mustSet(t, "0-31")
	r.startHolding(nodeSpec{id: "holder", buckets: "0-31", extra: []string{"--shutdown-timeout", "1s"}})
	r.startHolding(nodeSpec{id: "other", buckets: "32-63"})
	r.startStandby(nodeSpec{id: "standby", buckets: "0-31"})
	// A release announced before the standby listens would reach it only
	// at its next heartbeat.
	r.waitUntilListeningForReleases(3)

	const tasks = 1_000
	submitted := r.submitInBackground(probeLoad{
		tasks: tasks, minWork: 20 * time.Millisecond, maxWork: 2 * time.Second, over: 10 * time.Second, batch: 50,
	}, "term")
	r.waitUntilRunning("holder", 10)
	hp := r.rigNode("holder").proc
	termAt := time.Now()
	hp.term()
	r.waitUntilHeld("standby", low, failoverWithin)
	takeover := time.Since(termAt)
	if code := hp.wait(time.Minute); code != 0 {
		t.Errorf("the holder exited %d after SIGTERM, want 0", code)
	}
	r.fault(termAt, time.Now())

	// From the logs, to the millisecond: the holder's release and the
	// standby's acquisition.
	released := logLinesOf(hp, "bucket leases released")
	if len(released) != 1 {
		t.Fatalf("the holder logged %d lease releases, want 1", len(released))
	}
	releasedAt := logTime(released[0])
	// The holder logs its release once the statement has returned; the
	// standby, woken by the announcement sent at its commit, may log its
	// acquisition first on a loaded machine. Its first acquisition after
	// the SIGTERM is the one, and a hand-over logged in that order took no
	// time.
	var acquiredAt time.Time
	for _, l := range logLinesOf(r.rigNode("standby").proc, "bucket leases acquired") {
		if at := logTime(l); at.After(termAt) && (acquiredAt.IsZero() || at.Before(acquiredAt)) {
			acquiredAt = at
		}
	}
	handOver := max(acquiredAt.Sub(releasedAt), 0)
	if within := patience.Scale(10 * time.Second); acquiredAt.IsZero() || handOver > within {
		t.Errorf("the standby acquired the buckets %v after their release (at %v); want it within %v, through the announcement",
			handOver, acquiredAt, within)
	}
	if n, ok := r.node("holder"); !ok || n.Alive || n.StoppedAt.IsZero() {
		t.Errorf("after SIGTERM the holder is %+v, want it marked stopped", n)
	}

	submitted.wait()
	r.waitUntilSettled(tasks, settleWithin)
	fig := r.verify()
	var releasedTasks, finishedInShutdown int
	err := r.pool.QueryRow(context.Background(), `
SELECT count(*) FILTER (WHERE from_status = 'running' AND to_status = 'queued'),
       count(*) FILTER (WHERE to_status = 'succeeded' AND at >= $1)
FROM flotilla_task_events WHERE node = 'holder'`, termAt).Scan(&releasedTasks, &finishedInShutdown)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figures: scenario=sigterm sigterm_to_standby_holding=%v release_to_standby_acquired=%v finished_in_shutdown=%d released=%d %s",
		takeover.Round(time.Millisecond), handOver.Round(time.Millisecond), finishedInShutdown, releasedTasks, fig)
	if releasedTasks+finishedInShutdown == 0 {
		t.Errorf("the holder neither finished nor released a task after SIGTERM: it ran nothing, and the scenario proved nothing")
	}
}

// waitUntilRunning waits until the node runs at least n tasks: their
// handlers have started (the probe ledger has the start of the current
// attempt, and no end), not only their rows been claimed. A fault injected
// between a claim and its handlers' first write would otherwise find no
// execution to interrupt, and a scenario that follows the interrupted
// executions would wait for ones that never began.
func (r *rig) waitUntilRunning(node string, n int) {
	r.t.Helper()
	eventually(r.t, startWithin, fmt.Sprintf("%s runs %d tasks", node, n), func() bool {
		ctx, cancel := context.WithTimeout(r.t.Context(), queryTimeout)
		defer cancel()
		var running int
		err := r.pool.QueryRow(ctx, `
SELECT count(*) FROM flotilla_tasks t
WHERE t.node = $1 AND t.status = 'running'
  AND EXISTS (SELECT 1 FROM probe_ledger l WHERE l.task_id = t.id AND l.claim_seq = t.claim_seq AND l.ended_at IS NULL)`,
			node).Scan(&running)
		return err == nil && running >= n
	})
}

// waitForRenewal waits until node renews its leases of set (their expiry
// moves on), and returns their epochs then.
func (r *rig) waitForRenewal(node string, set bucket.Set) map[int]int64 {
	r.t.Helper()
	first := r.mustBuckets()
	var expiry time.Time
	for _, b := range first {
		if set.Contains(b.Bucket) && b.Holder == node {
			expiry = b.ExpiresAt
			break
		}
	}
	out := map[int]int64{}
	eventually(r.t, startWithin, node+" renews its leases", func() bool {
		bs, err := r.buckets()
		if err != nil {
			return false
		}
		for _, b := range bs {
			if set.Contains(b.Bucket) && b.Holder == node && b.ExpiresAt.After(expiry) {
				for _, b := range bs {
					if set.Contains(b.Bucket) {
						out[b.Bucket] = b.Epoch
					}
				}
				return true
			}
		}
		return false
	})
	return out
}

// healthReport is a node's /readyz answer.
type healthReport struct {
	ready   bool
	Held    string `json:"held"`
	Standby int    `json:"standby"`
	Reason  string `json:"reason"`
}

func (r *rig) readyz(id string) healthReport {
	r.t.Helper()
	addr := r.healthAddr(id)
	client := &http.Client{Timeout: queryTimeout}
	var h healthReport
	eventually(r.t, startWithin, id+" answers /readyz", func() bool {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || json.Unmarshal(body, &h) != nil {
			return false
		}
		h.ready = resp.StatusCode == http.StatusOK
		return true
	})
	return h
}

// describeDurations summarises measured durations: "n=12 min 3.1s median
// 3.6s max 4.2s".
func describeDurations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	parts := []string{
		fmt.Sprintf("n=%d", len(s)),
		"min " + s[0].Round(time.Millisecond).String(),
		"median " + s[len(s)/2].Round(time.Millisecond).String(),
		"max " + s[len(s)-1].Round(time.Millisecond).String(),
	}
	return strings.Join(parts, " ")
}
