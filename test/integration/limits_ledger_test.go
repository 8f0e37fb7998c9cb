package integration

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// limitedRun is one probe execution in the ledger: the task, its limit key,
// the node that ran it, and the span the handler ran.
type limitedRun struct {
	task        int64
	limitKey    string
	node        string
	start, stop time.Time
}

// limitedRuns reads every probe execution in the ledger. An execution a
// killed process left open ends when the process was gone; one left open
// by a process that was not killed fails the test.
func (r *rig) limitedRuns(ctx context.Context) []limitedRun {
	r.t.Helper()
	rows, err := r.pool.Query(ctx, `
SELECT l.task_id, t.limit_key, l.node, l.pid, l.started_at, l.ended_at
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
			pid int
			end *time.Time
		)
		if err := rows.Scan(&e.task, &e.limitKey, &e.node, &pid, &e.start, &end); err != nil {
			r.t.Fatalf("read the ledger: %v", err)
		}
		stop, killed := deaths[pid]
		switch {
		case end != nil:
			stop = *end
		case !killed:
			r.t.Errorf("task %d: an execution by pid %d, which was not killed, has no end", e.task, pid)
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

// busiestWindow returns the most starts that fall in one closed window
// [t, t+period], and the window's first start. starts are sorted in place.
func busiestWindow(starts []time.Time, period time.Duration) (int, time.Time) {
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	best, at, j := 0, time.Time{}, 0
	for i := range starts {
		// The window starting at starts[i] ends at starts[i]+period; j is
		// the first start after it.
		for j < len(starts) && !starts[j].After(starts[i].Add(period)) {
			j++
		}
		if n := j - i; n > best {
			best, at = n, starts[i]
		}
	}
	return best, at
}

// killBusyAndRestart kills, kills times, a node of nodes that is running
// tasks with SIGKILL, starts it again under its id once its registration has
// expired, and waits until it holds its buckets again. It returns the times
// the nodes took to hold their buckets again.
func (r *rig) killBusyAndRestart(ctx context.Context, nodes []nodeSpec, kills int) []time.Duration {
	r.t.Helper()
	var recoveries []time.Duration
	for range kills {
		s := r.busyNode(ctx, nodes)
		killed := r.kill9(s.id)
		r.waitUntilGone(s.id)
		r.start(s)
		r.waitUntilHeld(s.id, mustSet(r.t, s.buckets), failoverWithin)
		r.fault(killed, time.Now())
		recoveries = append(recoveries, time.Since(killed))
	}
	return recoveries
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
