package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/store"
)

// TestConcurrencyPerKeyHoldsThroughKillNine: three test workers with
// disjoint buckets run 2,000 probe tasks over 50 limit keys, each key
// limited to 2 running at once, while three holders, each running tasks,
// are killed with SIGKILL and started again. The probe's ledger must show at no instant more than 2 executions
// of one key (an execution of a killed process ends when the process is
// gone), and every task must succeed once (rig.verify).
func TestConcurrencyPerKeyHoldsThroughKillNine(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	r := newRig(t)
	const (
		tasks = 2000
		keys  = 50
		limit = 2
		kills = 3
	)
	ctx, cancel := context.WithTimeout(t.Context(), settleWithin)
	defer cancel()
	if _, err := r.client.Store().UpsertLimit(ctx, store.Limit{Name: "probe-per-key", Kind: "probe", Per: store.PerKey,
		Concurrency: limit}); err != nil {
		t.Fatal(err)
	}
	for _, s := range threeNodes {
		r.start(s)
	}
	for _, s := range threeNodes {
		r.waitUntilHeld(s.id, mustSet(t, s.buckets), startWithin)
	}
	began := time.Now()
	reqs := make([]flotilla.TaskRequest, tasks)
	for i := range reqs {
		work := 200*time.Millisecond + rand.N(200*time.Millisecond)
		payload, _ := json.Marshal(map[string]string{"duration": work.String()})
		reqs[i] = flotilla.TaskRequest{Kind: "probe", Key: fmt.Sprintf("lim-%d", i), LimitKey: fmt.Sprintf("tenant-%d", i%keys),
			Payload: payload, MaxAttempts: probeMaxAttempts}
	}
	created, err := r.client.SubmitMany(ctx, reqs, flotilla.AllowUnowned())
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range created {
		r.submitted = append(r.submitted, tk.ID)
	}
	// Each kill hits a node that is running tasks, so that some of them
	// must be rescued and the limit must hold through the rescue.
	recoveries := r.killBusyAndRestart(ctx, threeNodes, kills)
	r.waitUntilSettled(tasks, settleWithin)
	fig := r.verify()

	peak, over := r.peakPerLimitKey(ctx, limit)
	if len(over) > 0 {
		t.Errorf("more than %d executions of one limit key at once: %v", limit, over[:min(10, len(over))])
	}
	if peak != limit {
		t.Errorf("the busiest key ran %d at once, want %d: the load never reached the limit, and the test proved nothing", peak, limit)
	}
	if fig.rescued == 0 {
		t.Errorf("no task needed a second attempt: the kills hit no running task, and the test proved nothing")
	}
	t.Logf("figures: scenario=limits-per-key tasks=%d keys=%d concurrency=%d kills=%d peak=%d settled_after=%v %s",
		tasks, keys, limit, len(recoveries), peak, time.Since(began).Round(time.Second), fig)
}

// peakPerLimitKey reads the ledger and returns the most executions of one
// limit key that overlapped, and a description of every instant at which
// more than limit did. An execution a killed process left open
// ends when the process was gone.
func (r *rig) peakPerLimitKey(ctx context.Context, limit int) (int, []string) {
	r.t.Helper()
	rows, err := r.pool.Query(ctx, `
SELECT l.task_id, t.limit_key, l.pid, l.started_at, l.ended_at
FROM probe_ledger l JOIN flotilla_tasks t ON t.id = l.task_id`)
	if err != nil {
		r.t.Fatalf("read the ledger: %v", err)
	}
	defer rows.Close()
	type edge struct {
		at    time.Time
		delta int // +1 a start, -1 an end
		task  int64
	}
	byKey := map[string][]edge{}
	r.mu.Lock()
	deaths := r.deaths
	r.mu.Unlock()
	for rows.Next() {
		var (
			id    int64
			key   string
			pid   int
			start time.Time
			end   *time.Time
		)
		if err := rows.Scan(&id, &key, &pid, &start, &end); err != nil {
			r.t.Fatalf("read the ledger: %v", err)
		}
		stop, ok := deaths[pid]
		switch {
		case end != nil:
			stop = *end
		case !ok:
			r.t.Errorf("task %d: an execution by pid %d, which was not killed, has no end", id, pid)
			continue
		}
		byKey[key] = append(byKey[key], edge{start, +1, id}, edge{stop, -1, id})
	}
	if err := rows.Err(); err != nil {
		r.t.Fatalf("read the ledger: %v", err)
	}
	peak := 0
	var over []string
	for key, edges := range byKey {
		// At one instant, ends before starts: a slot freed at t may be
		// taken at t.
		slices.SortFunc(edges, func(a, b edge) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return a.delta - b.delta
		})
		running := 0
		for _, e := range edges {
			running += e.delta
			peak = max(peak, running)
			if running > limit && e.delta > 0 {
				over = append(over, fmt.Sprintf("%s: %d running when task %d started at %s", key, running, e.task,
					e.at.Format(time.RFC3339Nano)))
			}
		}
	}
	return peak, over
}
