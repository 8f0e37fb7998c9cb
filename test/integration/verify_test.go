package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// figures are what a scenario measured and checked; docs/reliability.md
// tabulates them.
type figures struct {
	tasks      int            // probe tasks submitted
	statuses   map[string]int // every task of the fleet, by status
	lost       int            // probe tasks submitted that did not succeed
	twice      int            // tasks with more than one success recorded
	executions int            // probe executions in the ledger
	rescued    int            // probe tasks that took more than one attempt
	overlaps   int            // pairs of executions of one task that overlapped
	// lateFenced counts executions of a frozen process that went on after
	// its successor had started, and that the database no longer counted
	// as current at their end: what fencing is for (DESIGN §5.2).
	lateFenced int
	trails     int // audit trails read through the store and checked
	// Schedules: ticks fired, ticks fired twice, ticks missed (all inside
	// fault windows, or the check fails).
	ticks, duplicateTicks, missedTicks int
}

func (f figures) String() string {
	s := fmt.Sprintf("tasks=%d lost=%d succeeded_twice=%d overlapping=%d executions=%d rescued=%d late_fenced=%d trails_read=%d statuses=%v",
		f.tasks, f.lost, f.twice, f.overlaps, f.executions, f.rescued, f.lateFenced, f.trails, f.statuses)
	if f.ticks > 0 {
		s += fmt.Sprintf(" ticks=%d duplicate_ticks=%d missed_ticks=%d", f.ticks, f.duplicateTicks, f.missedTicks)
	}
	return s
}

// verify checks the fleet's end state against the invariants and returns
// the figures. Every violation fails the test, naming a few examples.
func (r *rig) verify() figures {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var fig figures
	r.mu.Lock()
	submitted := append([]int64(nil), r.submitted...)
	r.mu.Unlock()
	fig.tasks = len(submitted)

	var err error
	if fig.statuses, err = r.counts(ctx); err != nil {
		r.t.Fatalf("count the tasks: %v", err)
	}
	r.checkTasks(ctx, submitted, &fig)
	r.checkTrails(ctx, &fig)
	r.checkLedger(ctx, &fig)
	if len(r.schedules) > 0 {
		r.checkSchedules(ctx, &fig)
	}
	return fig
}

// queryInts runs a query whose rows are one bigint each.
func (r *rig) queryInts(ctx context.Context, sql string, args ...any) []int64 {
	r.t.Helper()
	rows, err := r.pool.Query(ctx, sql, args...)
	if err != nil {
		r.t.Fatalf("%s: %v", strings.TrimSpace(sql), err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			r.t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// checkTasks: every probe task submitted exists and succeeded, and none
// succeeded twice.
func (r *rig) checkTasks(ctx context.Context, submitted []int64, fig *figures) {
	r.t.Helper()
	notSucceeded := r.queryInts(ctx, `
SELECT s.id FROM unnest($1::bigint[]) AS s(id)
LEFT JOIN flotilla_tasks t ON t.id = s.id
WHERE t.id IS NULL OR t.status <> 'succeeded' ORDER BY s.id`, submitted)
	fig.lost = len(notSucceeded)
	for i, id := range notSucceeded {
		if i == 10 {
			r.t.Errorf("... and %d more tasks that did not succeed", len(notSucceeded)-10)
			break
		}
		tr, err := r.get(id)
		if err != nil {
			r.t.Errorf("task %d did not succeed: %v", id, err)
			continue
		}
		r.t.Errorf("task %d did not succeed: %s; trail %s", id, describeTask(tr), trailOf(tr.Events))
	}

	twice := r.queryInts(ctx, `
SELECT task_id FROM flotilla_task_events WHERE to_status = 'succeeded'
GROUP BY task_id HAVING count(*) > 1 ORDER BY task_id`)
	fig.twice = len(twice)
	if len(twice) > 0 {
		r.t.Errorf("%d tasks succeeded more than once, e.g. %v", len(twice), head(twice))
	}
	fig.rescued = len(r.queryInts(ctx, `SELECT id FROM flotilla_tasks WHERE kind = 'probe' AND attempt > 1`))
}

// checkTrails: every task's audit trail is complete (one event per
// transition, sequence 2 to its status version, the creation being 1),
// chained (each event leaves the state the one before entered), in time
// order, made of transitions the state machine allows, and ends in the
// task's status. The whole fleet is checked in SQL; the trails of rescued
// tasks, the interesting ones, are also read through the store.
func (r *rig) checkTrails(ctx context.Context, fig *figures) {
	r.t.Helper()
	incomplete := r.queryInts(ctx, `
SELECT t.id FROM flotilla_tasks t LEFT JOIN flotilla_task_events e ON e.task_id = t.id
GROUP BY t.id, t.status_version
HAVING count(e.seq) <> t.status_version - 1
    OR (count(e.seq) > 0 AND (min(e.seq) <> 2 OR max(e.seq) <> t.status_version))
ORDER BY t.id`)
	if len(incomplete) > 0 {
		r.t.Errorf("%d tasks have an incomplete audit trail, e.g. %v", len(incomplete), head(incomplete))
	}
	broken := r.queryInts(ctx, `
SELECT DISTINCT task_id FROM (
    SELECT task_id, from_status, at,
           lag(to_status) OVER w AS prev_to, lag(at) OVER w AS prev_at
    FROM flotilla_task_events WINDOW w AS (PARTITION BY task_id ORDER BY seq)) x
WHERE (prev_to IS NOT NULL AND prev_to <> from_status)
   OR (prev_at IS NOT NULL AND at < prev_at)
   OR (prev_to IS NULL AND from_status NOT IN ('queued', 'scheduled', 'pending'))
ORDER BY task_id`)
	if len(broken) > 0 {
		r.t.Errorf("%d tasks have an audit trail out of order or not chained, e.g. %v", len(broken), head(broken))
	}
	wrongEnd := r.queryInts(ctx, `
SELECT t.id FROM flotilla_tasks t JOIN flotilla_task_events e ON e.task_id = t.id AND e.seq = t.status_version
WHERE e.to_status <> t.status ORDER BY t.id`)
	if len(wrongEnd) > 0 {
		r.t.Errorf("%d tasks' last event does not enter their status, e.g. %v", len(wrongEnd), head(wrongEnd))
	}
	rows, err := r.pool.Query(ctx, `SELECT DISTINCT from_status, to_status FROM flotilla_task_events`)
	if err != nil {
		r.t.Fatal(err)
	}
	var pairs [][2]string
	for rows.Next() {
		var p [2]string
		if err := rows.Scan(&p[0], &p[1]); err != nil {
			r.t.Fatal(err)
		}
		pairs = append(pairs, p)
	}
	rows.Close()
	for _, p := range pairs {
		if !task.CanTransition(task.Status(p[0]), task.Status(p[1])) {
			r.t.Errorf("an audit event records %s -> %s, which the state machine does not allow", p[0], p[1])
		}
	}

	// Through the store, as `worker get` reads them.
	rescued := r.queryInts(ctx, `SELECT id FROM flotilla_tasks WHERE attempt > 1 ORDER BY id LIMIT 300`)
	for _, id := range rescued {
		tk, err := r.client.Store().GetTask(ctx, id)
		if err != nil {
			r.t.Fatalf("get task %d: %v", id, err)
		}
		events, err := r.client.Store().TaskEvents(ctx, id)
		if err != nil {
			r.t.Fatalf("events of task %d: %v", id, err)
		}
		if msg := trailProblem(tk, events); msg != "" {
			r.t.Errorf("task %d: %s; trail %s", id, msg, trailOf(events))
		}
		fig.trails++
	}
}

// trailProblem says what is wrong with a task's trail, or "".
func trailProblem(tk *task.Task, events []task.Event) string {
	if int64(len(events)) != tk.StatusVersion {
		return fmt.Sprintf("%d events for status version %d", len(events), tk.StatusVersion)
	}
	for i, e := range events {
		if e.Seq != int64(i+1) {
			return fmt.Sprintf("event %d has sequence %d", i+1, e.Seq)
		}
		if i == 0 {
			continue
		}
		prev := events[i-1]
		if e.From != prev.To {
			return fmt.Sprintf("event %d leaves %s, but the one before entered %s", e.Seq, e.From, prev.To)
		}
		if e.At.Before(prev.At) {
			return fmt.Sprintf("event %d is dated before event %d", e.Seq, prev.Seq)
		}
		if !task.CanTransition(e.From, e.To) {
			return fmt.Sprintf("event %d: %s -> %s is not a transition", e.Seq, e.From, e.To)
		}
	}
	if last := events[len(events)-1]; last.To != tk.Status {
		return fmt.Sprintf("the last event enters %s, the task is %s", last.To, tk.Status)
	}
	return ""
}

// execution is one row of the probe ledger.
type execution struct {
	task     int64
	attempt  int
	claimSeq int64
	node     string
	pid      int
	start    time.Time
	end      time.Time // zero: not recorded
	outcome  string
	current  *bool
	active   bool // the task is running now (a schedule's, fired late in the scenario)
}

// checkLedger: no two executions of a task overlapped, and the attempt
// each task's success names ran to its end. An execution that a kill -9
// cut short ends when its process was gone. An execution of a process
// frozen with SIGSTOP may outlive its lease; it is no overlap if the
// database no longer counted it current at its end, so that whatever it
// wrote with its fencing token was refused.
func (r *rig) checkLedger(ctx context.Context, fig *figures) {
	r.t.Helper()
	rows, err := r.pool.Query(ctx, `
SELECT l.task_id, l.attempt, l.claim_seq, l.node, l.pid, l.started_at, l.ended_at, coalesce(l.outcome, ''), l.current,
       t.status IN ('running', 'stopping', 'pausing')
FROM probe_ledger l JOIN flotilla_tasks t ON t.id = l.task_id ORDER BY l.task_id, l.started_at`)
	if err != nil {
		r.t.Fatalf("read the ledger: %v", err)
	}
	byTask := map[int64][]execution{}
	for rows.Next() {
		var e execution
		var end *time.Time
		if err := rows.Scan(&e.task, &e.attempt, &e.claimSeq, &e.node, &e.pid, &e.start, &end, &e.outcome, &e.current, &e.active); err != nil {
			r.t.Fatal(err)
		}
		if end != nil {
			e.end = *end
		}
		byTask[e.task] = append(byTask[e.task], e)
		fig.executions++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}

	r.mu.Lock()
	deaths, frozen := r.deaths, r.frozen
	r.mu.Unlock()
	var problems []string
	ids := make([]int64, 0, len(byTask))
	for id := range byTask {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		execs := byTask[id]
		for i := range execs {
			a := &execs[i]
			if a.end.IsZero() {
				died, ok := deaths[a.pid]
				if !ok && a.active {
					continue // still running: an end will come
				}
				if !ok {
					problems = append(problems, fmt.Sprintf("task %d attempt %d on %s (pid %d) never recorded its end, and its process was not killed",
						id, a.attempt, a.node, a.pid))
					continue
				}
				a.end = died
			}
		}
		for i := range execs {
			for j := i + 1; j < len(execs); j++ {
				a, b := execs[i], execs[j] // a started first
				if a.end.IsZero() || !b.start.Before(a.end) {
					continue
				}
				if lateAfterFreeze(a, b, frozen[a.pid]) {
					fig.lateFenced++
					continue
				}
				fig.overlaps++
				problems = append(problems, fmt.Sprintf("task %d: attempt %d on %s (pid %d, %s to %s, %s, current at its end: %s) overlaps attempt %d on %s (from %s)",
					id, a.attempt, a.node, a.pid, a.start.Format(time.StampMicro), a.end.Format(time.StampMicro), a.outcome,
					describeCurrent(a.current), b.attempt, b.node, b.start.Format(time.StampMicro)))
			}
		}
	}
	for i, p := range problems {
		if i == 10 {
			r.t.Errorf("... and %d more problems in the ledger", len(problems)-10)
			break
		}
		r.t.Error(p)
	}

	unproven := r.queryInts(ctx, `
SELECT e.task_id FROM flotilla_task_events e JOIN flotilla_tasks t ON t.id = e.task_id
WHERE e.to_status = 'succeeded' AND t.kind = 'probe'
  AND NOT EXISTS (SELECT 1 FROM probe_ledger l
                  WHERE l.task_id = e.task_id AND l.attempt = e.attempt AND l.outcome = 'done')
ORDER BY e.task_id`)
	if len(unproven) > 0 {
		r.t.Errorf("%d tasks succeeded with an attempt the ledger does not show done, e.g. %v", len(unproven), head(unproven))
	}
}

func describeCurrent(c *bool) string {
	switch {
	case c == nil:
		return "not recorded"
	case *c:
		return "yes"
	}
	return "no"
}

// lateAfterFreeze reports whether execution a overlaps b only because a's
// process was frozen: b began after a freeze of a's process began, during
// a, and the database did not count a current when it ended.
func lateAfterFreeze(a, b execution, freezes []window) bool {
	if a.current == nil || *a.current {
		return false
	}
	for _, w := range freezes {
		if w.from.After(a.start) && w.from.Before(a.end) && !b.start.Before(w.from) {
			return true
		}
	}
	return false
}

// checkSchedules: no tick fired twice, and ticks were missed only inside
// fault windows.
func (r *rig) checkSchedules(ctx context.Context, fig *figures) {
	r.t.Helper()
	dup := r.queryInts(ctx, `
SELECT count(*) FROM (SELECT 1 FROM flotilla_tasks WHERE schedule IS NOT NULL
                      GROUP BY schedule, scheduled_for HAVING count(*) > 1) d`)
	fig.duplicateTicks = int(dup[0])
	if fig.duplicateTicks > 0 {
		r.t.Errorf("%d schedule ticks fired more than one task", fig.duplicateTicks)
	}
	r.mu.Lock()
	faults := append([]window(nil), r.faults...)
	r.mu.Unlock()
	for _, name := range r.schedules {
		rows, err := r.pool.Query(ctx, `SELECT scheduled_for FROM flotilla_tasks WHERE schedule = $1 ORDER BY scheduled_for`, name)
		if err != nil {
			r.t.Fatal(err)
		}
		var ticks []time.Time
		for rows.Next() {
			var at time.Time
			if err := rows.Scan(&at); err != nil {
				r.t.Fatal(err)
			}
			ticks = append(ticks, at)
		}
		rows.Close()
		fig.ticks += len(ticks)
		if len(ticks) < 2 {
			r.t.Errorf("schedule %s fired %d times, want it to fire every second", name, len(ticks))
			continue
		}
		for i := 1; i < len(ticks); i++ {
			for missed := ticks[i-1].Add(time.Second); missed.Before(ticks[i]); missed = missed.Add(time.Second) {
				fig.missedTicks++
				if !inAny(missed, faults, r.leaseTTL+r.misfire) {
					r.t.Errorf("schedule %s skipped the tick of %s, outside every fault window", name, missed.Format(time.StampMilli))
				}
			}
		}
	}
}

// inAny reports whether t falls in one of the windows, each widened by
// slack on both sides.
func inAny(t time.Time, ws []window, slack time.Duration) bool {
	for _, w := range ws {
		if (window{from: w.from.Add(-slack), to: w.to.Add(slack)}).contains(t) {
			return true
		}
	}
	return false
}

// head returns the first few ids of a list, for messages.
func head(ids []int64) []int64 {
	if len(ids) > 10 {
		return ids[:10]
	}
	return ids
}
