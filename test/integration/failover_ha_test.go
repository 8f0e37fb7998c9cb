//go:build failover

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// The database failover scenario (issue 39): three nodes on the multi-host
// URI of a pg_auto_failover formation (a primary and a synchronous
// standby) work through 5,000 tasks of 50 ms, a schedule ticking every
// second and stops issued during the run, while the formation fails over:
// planned switchovers (`pg_autoctl perform failover`), then the loss of the
// primary's machine (its keeper and postmaster killed, the standby
// promoted). The ledger must show every task succeeded exactly once with no
// two attempts of a task at once, every tick fired once, every stop
// applied, the fleet claiming again at its full rate within 30 s of each
// promotion, and no node process gone.
//
// FLOTILLA_HA_FAILOVERS sets how many planned switchovers run (default 2);
// the test logs, per failover, the time from the primary's loss to the
// fleet's first claim on the new primary, for docs/reliability.md.
// FLOTILLA_HA_ASYNC=1 runs the formation with asynchronous replication.

const (
	haTasks   = 5000
	haTask    = `{"duration":"50ms"}`
	haStops   = 6
	haStopRun = `{"duration":"10m"}`
	// haLeaseTTL outlasts a switchover and the loss of the primary's
	// machine (about 50 s in a two-node formation): the nodes keep their
	// leases through the outage, so that an outcome whose write was cut is
	// written again afterwards rather than its task run again.
	haLeaseTTL = 90 * time.Second
	// haMisfire is long enough that every tick due while no primary took
	// writes fires late, once, rather than being skipped.
	haMisfire = 10 * time.Minute
	// haBackWithin bounds the time from a promotion to the fleet claiming
	// at its full rate again (before patience.Scale).
	haBackWithin = 30 * time.Second
)

// haFailover is one failover of the run, for the figures.
type haFailover struct {
	kind     string    // "switchover" or "machine lost"
	lost     time.Time // when the failover was asked for, or the primary killed
	promoted time.Time // when the new primary took writes, as the cluster saw it
	claimed  time.Time // the fleet's first claim after the outage
	back     time.Time // the backlog down to its level before the failover
}

func TestAFleetRidesOutItsDatabasesFailovers(t *testing.T) {
	needsIntegration(t)
	takeFleetSlot(t)
	switchovers := 2
	if v := os.Getenv("FLOTILLA_HA_FAILOVERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("FLOTILLA_HA_FAILOVERS=%q: want a count", v)
		}
		switchovers = n
	}
	c := testdb.StartHACluster(t)
	if os.Getenv("FLOTILLA_HA_ASYNC") != "" {
		// By hand only: with asynchronous replication the checks may fail,
		// and what they report is the measure.
		c.SetAsynchronous()
		eventually(t, time.Minute, "the primary commits without waiting for its standby", func() bool {
			ctx, cancel := context.WithTimeout(t.Context(), queryTimeout)
			defer cancel()
			conn, err := pgx.Connect(ctx, c.URI())
			if err != nil {
				return false
			}
			defer conn.Close(ctx)
			var names string
			err = conn.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names)
			return err == nil && names == ""
		})
	}
	e := newElasticFleet(t, c.URI(), leaseTTL(haLeaseTTL))
	e.extra = []string{"--schedule-misfire", patience.Scale(haMisfire).String()}
	nodes := []string{"n1", "n2", "n3"}
	for _, id := range nodes {
		e.start(id)
	}
	eventually(t, 2*startWithin, "three nodes hold 21 buckets each (±1)", func() bool {
		return e.balanced(map[string]int{"n1": 21, "n2": 21, "n3": 21})
	})

	// The load, paced to last through the failovers, then the rest at
	// once; submissions cut by a failover are retried.
	rate := max(20, haTasks/(40*switchovers+120))
	flush := make(chan struct{})
	loaded := make(chan struct{})
	acks := &haAcks{when: map[int64]time.Time{}}
	go func() {
		defer close(loaded)
		haSubmit(e, acks, rate, flush)
	}()
	t.Cleanup(func() { e.cancel(); <-loaded })

	// The stops: long tasks stopped one by one through the run.
	var stops []int64
	for i := range haStops {
		id := haSubmitOne(e, flotilla.TaskRequest{Kind: "probe", Key: fmt.Sprintf("stop-%d", i),
			Payload: json.RawMessage(haStopRun), MaxAttempts: probeMaxAttempts})
		stops = append(stops, id)
	}
	stopped := 0
	stopNext := func() {
		t.Helper()
		if stopped < len(stops) {
			haStop(e, stops[stopped])
			stopped++
		}
	}

	e.waitForWork(4 * rate)
	stopNext()
	var failovers []haFailover
	for i := range switchovers {
		e.waitForWork(5 * rate)
		stopNext()
		f := haFailover{kind: "switchover", lost: time.Now()}
		c.Failover()
		f.promoted = time.Now()
		stopNext()
		f.back = haBackToRate(e, rate, f.promoted)
		failovers = append(failovers, f)
		t.Logf("switchover %d: the fleet back at its rate %v after the primary's loss", i+1,
			f.back.Sub(f.lost).Round(time.Millisecond))
	}
	e.waitForWork(5 * rate)
	stopNext()
	f := haFailover{kind: "machine lost", lost: time.Now()}
	old := c.KillPrimaryNode()
	c.WaitForPrimary(old)
	c.WaitForWritable()
	f.promoted = time.Now()
	stopNext()
	f.back = haBackToRate(e, rate, f.promoted)
	failovers = append(failovers, f)
	for stopped < len(stops) {
		stopNext()
	}
	close(flush)
	<-loaded

	for _, id := range nodes {
		if e.procs[id].exited() {
			t.Errorf("node %s exited during the failovers:\n%s", id, e.procs[id].output())
		}
	}
	e.stopLoad()
	haCheck(e, acks, stops, failovers)
}

// haSubmitOne submits one task, retrying through a failover: a retry after
// a commit that was not acknowledged may add a second task, which the
// checks hold to the same rules (it is not in e.submitted).
func haSubmitOne(e *elasticFleet, req flotilla.TaskRequest) int64 {
	e.t.Helper()
	var id int64
	eventually(e.t, 3*time.Minute, "a task is submitted", func() bool {
		ctx, cancel := context.WithTimeout(e.ctx, queryTimeout)
		defer cancel()
		tks, err := e.client.SubmitMany(ctx, []flotilla.TaskRequest{req}, flotilla.AllowUnowned(), flotilla.AllowUnknownKind())
		if err != nil {
			return false
		}
		id = tks[0].ID
		return true
	})
	return id
}

// haSubmit submits haTasks tasks, rate a second until flush is closed and
// then the rest at once.
func haSubmit(e *elasticFleet, acks *haAcks, rate int, flush <-chan struct{}) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for next := 0; next < haTasks; {
		batch := max(rate/10, 1)
		select {
		case <-e.ctx.Done():
			return
		case <-flush:
			batch = 200
		case <-tick.C:
		}
		reqs := make([]flotilla.TaskRequest, min(batch, haTasks-next))
		for i := range reqs {
			reqs[i] = flotilla.TaskRequest{Kind: "probe", Key: fmt.Sprintf("ha-%d", next+i),
				Payload: json.RawMessage(haTask), MaxAttempts: probeMaxAttempts}
		}
		for {
			ctx, cancel := context.WithTimeout(e.ctx, queryTimeout)
			tks, err := e.client.SubmitMany(ctx, reqs, flotilla.AllowUnowned(), flotilla.AllowUnknownKind())
			cancel()
			if e.ctx.Err() != nil {
				return
			}
			if err == nil {
				acks.record(tks, time.Now())
				e.mu.Lock()
				for _, tk := range tks {
					e.submitted = append(e.submitted, tk.ID)
				}
				e.mu.Unlock()
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		next += len(reqs)
	}
}

// haStop stops task id once it runs, retrying through a failover.
func haStop(e *elasticFleet, id int64) {
	e.t.Helper()
	eventually(e.t, 3*time.Minute, fmt.Sprintf("task %d is stopped", id), func() bool {
		ctx, cancel := context.WithTimeout(e.ctx, queryTimeout)
		defer cancel()
		if _, err := e.client.Stop(ctx, id, flotilla.Reason("failover scenario")); err == nil {
			return true
		}
		// A retry after a stop whose commit was not acknowledged finds it
		// applied.
		r, err := e.client.Get(ctx, id)
		return err == nil && (r.Status == task.Stopping || r.Status == task.Stopped)
	})
}

// haBackToRate waits until the fleet has worked off the backlog the outage
// left, within haBackWithin of the promotion, and returns when.
func haBackToRate(e *elasticFleet, rate int, promoted time.Time) time.Time {
	e.t.Helper()
	within := patience.Scale(haBackWithin)
	var last int
	for {
		ctx, cancel := context.WithTimeout(e.t.Context(), queryTimeout)
		bs, err := e.client.Store().BucketBacklog(ctx)
		cancel()
		if err == nil {
			last = 0
			for _, b := range bs {
				last += b.Queued + b.Waiting
			}
			if last <= 2*rate {
				return time.Now()
			}
		}
		if time.Since(promoted) > within {
			e.t.Fatalf("%v after the promotion, %d tasks still wait (last error %v): the fleet is not back at its rate",
				time.Since(promoted).Round(time.Millisecond), last, err)
		}
		time.Sleep(pollInterval)
	}
}

// haStarts returns the start of every execution in the ledger files.
func haStarts(e *elasticFleet) []time.Time {
	e.t.Helper()
	files, _ := filepath.Glob(filepath.Join(e.dir, "*.jsonl"))
	var out []time.Time
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			e.t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r ledgerRecord
			if json.Unmarshal(sc.Bytes(), &r) == nil && r.Event == "start" {
				out = append(out, r.At)
			}
		}
		_ = f.Close()
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// haAcks records when each submission returned its ids, to place a task
// missing afterwards among the failovers.
type haAcks struct {
	mu   sync.Mutex
	when map[int64]time.Time
}

func (a *haAcks) record(tks []*task.Task, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, tk := range tks {
		a.when[tk.ID] = at
	}
}

func (a *haAcks) at(id int64) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.when[id]
}

// whenAmong places t among the failovers, for a task that went missing.
func whenAmong(t time.Time, failovers []haFailover) string {
	for i, f := range failovers {
		switch {
		case t.Before(f.lost):
			return fmt.Sprintf("%v before failover %d (%s) was asked for", f.lost.Sub(t).Round(time.Millisecond), i+1, f.kind)
		case t.Before(f.promoted):
			return fmt.Sprintf("%v into failover %d (%s), before its promotion", t.Sub(f.lost).Round(time.Millisecond), i+1, f.kind)
		}
	}
	if n := len(failovers); n > 0 {
		return fmt.Sprintf("%v after the last promotion", t.Sub(failovers[n-1].promoted).Round(time.Millisecond))
	}
	return "with no failover"
}

// haCheck holds the run to the scenario's promises and logs the figures.
func haCheck(e *elasticFleet, acks *haAcks, stops []int64, failovers []haFailover) {
	t := e.t
	t.Helper()
	e.mu.Lock()
	problems := slices.Clone(e.problems)
	submitted := slices.Clone(e.submitted)
	e.mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	all, err := e.client.List(ctx, store.TaskFilter{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	isStop := map[int64]bool{}
	for _, id := range stops {
		isStop[id] = true
	}
	status := map[int64]task.Status{}
	var ticks []time.Time
	stopsLost := 0
	for _, tk := range all {
		status[tk.ID] = tk.Status
		if tk.Schedule == elasticTick {
			ticks = append(ticks, tk.ScheduledFor)
		}
		switch {
		case isStop[tk.ID]:
			if tk.Status != task.Stopped {
				stopsLost++
				t.Errorf("task %d, stopped during the run, ended %s", tk.ID, tk.Status)
			}
		case tk.Status != task.Succeeded:
			t.Errorf("task %d (%s, key %s) ended %s, want succeeded", tk.ID, tk.Kind, tk.Key, tk.Status)
		}
	}
	for _, id := range submitted {
		if _, ok := status[id]; !ok {
			at := acks.at(id)
			t.Errorf("task %d, submitted, is not in the store: its ids were returned at %s, %s",
				id, at.Format("15:04:05.000"), whenAmong(at, failovers))
		}
	}

	sort.Slice(ticks, func(i, j int) bool { return ticks[i].Before(ticks[j]) })
	ticksOff := 0
	for i := 1; i < len(ticks); i++ {
		if d := ticks[i].Sub(ticks[i-1]); d != time.Second {
			ticksOff++
			t.Errorf("ticks %s and %s are %v apart, want 1s: a tick fired twice or was missed",
				ticks[i-1].Format(time.RFC3339), ticks[i].Format(time.RFC3339), d)
		}
	}

	execs := e.executions()
	byTask := map[int64][]probeRun{}
	for _, x := range execs {
		byTask[x.task] = append(byTask[x.task], x)
	}
	rerun := 0
	for id, xs := range byTask {
		sort.Slice(xs, func(i, j int) bool { return xs[i].start.Before(xs[j].start) })
		for i := 1; i < len(xs); i++ {
			prev, cur := xs[i-1], xs[i]
			if cur.start.Before(prev.end) {
				t.Errorf("task %d ran twice at once: claim %d on %s from %s, claim %d on %s until %s", id,
					cur.claimSeq, cur.node, cur.start.Format(time.StampMicro), prev.claimSeq, prev.node,
					prev.end.Format(time.StampMicro))
			}
			if prev.outcome == "done" {
				rerun++
				t.Errorf("task %d ran again (claim %d on %s) after a run that finished (claim %d on %s)", id,
					cur.claimSeq, cur.node, prev.claimSeq, prev.node)
			}
		}
		if last := xs[len(xs)-1]; !isStop[id] && last.outcome != "done" {
			t.Errorf("task %d's last run ended %q", id, last.outcome)
		}
	}
	for _, id := range submitted {
		if len(byTask[id]) == 0 {
			t.Errorf("task %d succeeded with no run in the ledger", id)
		}
	}

	// The figures: from the primary's loss to the first claim after the
	// outage (the first start after the longest pause in starts between
	// the loss and the fleet's return to its rate, that first start
	// included: it may come after the moment the rate is judged back).
	starts := haStarts(e)
	var toClaim []time.Duration
	for i, f := range failovers {
		var gapEnd time.Time
		var gap time.Duration
		prev := f.lost
		for _, s := range starts {
			if s.Before(f.lost) {
				continue
			}
			if d := s.Sub(prev); d > gap {
				gap, gapEnd = d, s
			}
			prev = s
			if s.After(f.back) {
				break
			}
		}
		if gapEnd.IsZero() {
			gapEnd = f.lost
		}
		d := gapEnd.Sub(f.lost)
		toClaim = append(toClaim, d)
		t.Logf("failover %d (%s): primary lost to first claim %v (longest pause in claims %v); promoted after %v; back at rate after %v",
			i+1, f.kind, d.Round(time.Millisecond), gap.Round(time.Millisecond), f.promoted.Sub(f.lost).Round(time.Millisecond),
			f.back.Sub(f.lost).Round(time.Millisecond))
	}
	sorted := slices.Clone(toClaim)
	slices.Sort(sorted)
	t.Logf("FIGURES: %d failovers; primary lost to first claim p50 %v max %v; tasks re-run after success %d; tick gaps or doubles %d; stops lost %d; %d tasks, %d runs, %d ticks",
		len(sorted), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond),
		rerun, ticksOff, stopsLost, len(all), len(execs), len(ticks))
}
