package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// limitedRun is one probe execution in the ledger: the task, its limit key,
// the node that ran it, and the span the handler ran.
type limitedRun struct {
	task        int64
	attempt     int
	limitKey    string
	node        string
	pid         int
	start, stop time.Time
}

// limitedRuns reads every probe execution in the ledger. An execution a
// killed process left open ends when the process was gone; one left open
// by a process that was not killed fails the test.
func (r *rig) limitedRuns(ctx context.Context) []limitedRun {
	r.t.Helper()
	rows, err := r.pool.Query(ctx, `
SELECT l.task_id, l.attempt, t.limit_key, l.node, l.pid, l.started_at, l.ended_at
FROM probe_ledger l JOIN flotilla_tasks t ON t.id = l.task_id`)
	if err != nil {
		r.t.Fatalf("read the ledger: %v", err)
	}
	defer rows.Close()
	r.mu.Lock()
	deaths := r.deaths
	r.mu.Unlock()
	var out []limitedRun
	for rows.Next() {
		var (
			e   limitedRun
			end *time.Time
		)
		if err := rows.Scan(&e.task, &e.attempt, &e.limitKey, &e.node, &e.pid, &e.start, &end); err != nil {
			r.t.Fatalf("read the ledger: %v", err)
		}
		stop, killed := deaths[e.pid]
		switch {
		case end != nil:
			stop = *end
		case !killed:
			r.t.Errorf("task %d: an execution by pid %d, which was not killed, has no end", e.task, e.pid)
			continue
		}
		e.stop = stop
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		r.t.Fatalf("read the ledger: %v", err)
	}
	return out
}

// peakOverlap returns the most executions that ran at one instant, and a
// description of every start that made more than limit run at once. At
// one instant ends come before starts: a slot freed at t may be taken at t.
func peakOverlap(execs []limitedRun, limit int) (int, []string) {
	type edge struct {
		at    time.Time
		delta int // +1 a start, -1 an end
		e     limitedRun
	}
	edges := make([]edge, 0, 2*len(execs))
	for _, e := range execs {
		edges = append(edges, edge{e.start, +1, e}, edge{e.stop, -1, e})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	peak, running := 0, 0
	var over []string
	for _, ed := range edges {
		running += ed.delta
		peak = max(peak, running)
		if running > limit && ed.delta > 0 {
			over = append(over, fmt.Sprintf("%d running when task %d started on %s at %s", running, ed.e.task,
				ed.e.node, ed.at.Format(time.RFC3339Nano)))
		}
	}
	return peak, over
}

// busiestWindow returns the starts of runs that fall in the closed window
// [t, t+period] that holds the most of them. runs are sorted by start in
// place.
func busiestWindow(runs []limitedRun, period time.Duration) []limitedRun {
	slices.SortFunc(runs, func(a, b limitedRun) int { return a.start.Compare(b.start) })
	var best []limitedRun
	j := 0
	for i := range runs {
		// The window opened by runs[i] ends at its start + period; j is
		// the first run that starts after it.
		for j < len(runs) && !runs[j].start.After(runs[i].start.Add(period)) {
			j++
		}
		if j-i > len(best) {
			best = runs[i:j]
		}
	}
	return best
}

// describeStarts lists runs as "start task/attempt on node (pid)", for a
// failure's message.
func describeStarts(runs []limitedRun) string {
	var b strings.Builder
	for i, e := range runs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s task %d/%d on %s (pid %d)", e.start.Format("15:04:05.000"), e.task, e.attempt, e.node, e.pid)
	}
	return b.String()
}

// killBusyAndRestart kills, kills times, a node of nodes whose live
// process is running tasks with SIGKILL, starts it again under its id once
// its registration has expired, and waits until the new process holds
// every bucket of the node. It returns the times from each kill to that.
//
// Both conditions are read by incarnation, not by node id: a task still
// running in the rows of a process killed before does not make its node
// busy, and the lapsing leases of the killed process do not count as held,
// so that each kill hits a process that has taken over and runs tasks.
func (r *rig) killBusyAndRestart(ctx context.Context, nodes []nodeSpec, kills int) []time.Duration {
	r.t.Helper()
	var recoveries []time.Duration
	for range kills {
		s := r.busyProcess(ctx, nodes)
		killed := r.kill9(s.id)
		r.waitUntilGone(s.id)
		r.start(s)
		r.waitUntilHeldByLiveProcess(ctx, s)
		r.fault(killed, time.Now())
		recoveries = append(recoveries, time.Since(killed))
	}
	return recoveries
}

// busyProcess waits until the live process of one of nodes runs a task, by
// the database, and returns that node.
func (r *rig) busyProcess(ctx context.Context, nodes []nodeSpec) nodeSpec {
	r.t.Helper()
	var busy nodeSpec
	eventually(r.t, failoverWithin, "a live node runs a task", func() bool {
		qctx, cancel := context.WithTimeout(ctx, queryTimeout)
		defer cancel()
		var id string
		err := r.pool.QueryRow(qctx, `
SELECT n.id FROM flotilla_tasks t JOIN flotilla_nodes n ON n.incarnation = t.owner
WHERE t.status = 'running' AND n.stopped_at IS NULL AND n.expires_at > statement_timestamp()
LIMIT 1`).Scan(&id)
		if err != nil {
			return false
		}
		for _, s := range nodes {
			if s.id == id {
				busy = s
				return true
			}
		}
		return false
	})
	return busy
}

// waitUntilHeldByLiveProcess waits until the node's live process holds a
// live lease on every bucket of the node.
func (r *rig) waitUntilHeldByLiveProcess(ctx context.Context, s nodeSpec) {
	r.t.Helper()
	want := mustSet(r.t, s.buckets).Len()
	var held int
	eventually(r.t, failoverWithin, "the new process of "+s.id+" holds its buckets", func() bool {
		qctx, cancel := context.WithTimeout(ctx, queryTimeout)
		defer cancel()
		err := r.pool.QueryRow(qctx, `
SELECT count(*) FROM flotilla_bucket_leases b JOIN flotilla_nodes n ON n.incarnation = b.owner
WHERE n.id = $1 AND n.stopped_at IS NULL AND n.expires_at > statement_timestamp()
  AND b.expires_at > statement_timestamp()`, s.id).Scan(&held)
		return err == nil && held == want
	})
}

// limitKeysSpread returns n limit keys named prefix-i, chosen so that the
// nodes' bucket ranges hold them as evenly as the count allows: every node
// then enforces some of them, and a kill of any node hits some.
func (r *rig) limitKeysSpread(prefix string, n int, nodes []nodeSpec) []string {
	r.t.Helper()
	per := make([]int, len(nodes))
	quota := (n + len(nodes) - 1) / len(nodes)
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if i > 100*n {
			r.t.Fatalf("found only %d of %d limit keys spread over %d nodes", len(keys), n, len(nodes))
		}
		k := fmt.Sprintf("%s-%d", prefix, i)
		b := r.policy.Of(k)
		for j, s := range nodes {
			if mustSet(r.t, s.buckets).Contains(b) && per[j] < quota {
				per[j]++
				keys = append(keys, k)
				break
			}
		}
	}
	return keys
}
