package postgres

import (
	"strings"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// SQL fragments shared by several statements. They are built once from
// constants and the task package's table, never from input.

// Status lists as SQL literals.
var (
	activeStatusesSQL    = sqlList(task.Running, task.Stopping, task.Pausing)
	claimableStatusesSQL = sqlList(task.Queued, task.Scheduled, task.Retrying)
	terminalStatusesSQL  = sqlList(task.TerminalStates()...)
)

func sqlList(statuses ...task.Status) string {
	quoted := make([]string, len(statuses))
	for i, s := range statuses {
		quoted[i] = "'" + string(s) + "'"
	}
	return "(" + strings.Join(quoted, ", ") + ")"
}

// allowedFrom and allowedTo are the transition table as pairs, the
// parameters that let a statement check a move against the table:
// (from, to) IN (SELECT * FROM unnest($from, $to)).
var allowedFrom, allowedTo = transitionPairs()

func transitionPairs() (from, to []string) {
	for _, f := range task.All() {
		for _, t := range task.Next(f) {
			from = append(from, string(f))
			to = append(to, string(t))
		}
	}
	return from, to
}

// attemptEndsSQL lists the states in which an active attempt can end
// other than success: every state the table reaches from an active state
// that is neither active nor succeeded. A pending stop turns these into
// stopped (see stopDestinationSQL).
var attemptEndsSQL = func() string {
	seen := map[task.Status]bool{}
	var ends []task.Status
	for _, from := range task.All() {
		if !from.Active() {
			continue
		}
		for _, to := range task.Next(from) {
			if !to.Active() && to != task.Succeeded && !seen[to] {
				seen[to] = true
				ends = append(ends, to)
			}
		}
	}
	return sqlList(ends...)
}()

// bucketSetNotifySQL returns CTEs that send one notification on topic whose
// payload is the canonical bucket set string (bucket.Set.String: ascending,
// runs of two or more as lo-hi) of the buckets selected by bucketsQuery, and
// nothing when it selects none. The CTE named name yields one row per
// notification sent; the statement must reference it (for example as
// (SELECT count(*) FROM name)) for it to run.
func bucketSetNotifySQL(name string, topic string, bucketsQuery string) string {
	return name + `_runs AS (
    SELECT min(b) AS lo, max(b) AS hi
    FROM (SELECT b, b - row_number() OVER (ORDER BY b) AS grp
          FROM (SELECT DISTINCT bucket AS b FROM (` + bucketsQuery + `) q) d) g
    GROUP BY grp
), ` + name + ` AS (
    SELECT pg_notify('` + topic + `',
        string_agg(CASE WHEN lo = hi THEN lo::text ELSE lo::text || '-' || hi::text END, ',' ORDER BY lo))
    FROM ` + name + `_runs
    HAVING count(*) > 0
)`
}

// transitionSetSQL is the SET list of a transition, shared by Transition and
// AdvanceActive. In it, t is the task row before the move (t.status is the
// state it leaves) and c provides dest (the destination after the
// pending-stop rule), err (the error to record) and delay_us (for retrying
// and scheduled).
var transitionSetSQL = `
    status = c.dest,
    status_version = t.status_version + 1,
    -- A release at shutdown (back to queued from an active state) does not
    -- count the attempt; claim_seq stays moved on.
    attempt = CASE WHEN c.dest = 'queued' AND t.status IN ` + activeStatusesSQL + `
                   THEN t.attempt - 1 ELSE t.attempt END,
    run_at = CASE WHEN c.dest IN ('retrying', 'scheduled')
                  THEN statement_timestamp() + c.delay_us * interval '1 microsecond'
                  WHEN c.dest = 'queued' THEN statement_timestamp()
                  ELSE t.run_at END,
    -- Leaving the active states clears the owner and the task lease; node,
    -- epoch and claim_seq stay for history.
    owner = CASE WHEN c.dest IN ` + activeStatusesSQL + ` THEN t.owner END,
    lease_expires_at = CASE WHEN c.dest IN ` + activeStatusesSQL + ` THEN t.lease_expires_at END,
    finished_at = CASE WHEN c.dest IN ` + terminalStatusesSQL + ` THEN statement_timestamp() END,
    -- Requests are for the attempt: leaving the active states answers them.
    stop_requested = c.dest IN ` + activeStatusesSQL + ` AND t.stop_requested,
    pause_requested = c.dest IN ` + activeStatusesSQL + ` AND t.pause_requested,
    -- An attempt that ends records its error, or none; any other move
    -- keeps the task's error unless it names one.
    error = CASE WHEN t.status IN ` + activeStatusesSQL + ` AND c.dest NOT IN ` + activeStatusesSQL + `
                 THEN c.err
                 WHEN c.err <> '' THEN c.err
                 ELSE t.error END,
    updated_at = statement_timestamp()`

// stopDestinationSQL computes the destination of a move under the
// pending-request rules, for a locked task row t (with its stop_requested
// and pause_requested columns) and a requested destination want: an active
// task whose attempt ends other than by success (attemptEndsSQL), while it
// is stopping or has a stop requested, is stopped instead; one whose attempt
// ends with a retry or a release, while it is pausing or has a pause
// requested, is paused instead. The flags are read from the locked row, so
// a request committed while the move waited for the lock is seen.
//
// The stop redirect is not checked against the table: the table lists what
// a stopping task may become, not every outcome its handler can report
// (failed, retrying...), and it has no pausing -> stopped edge although a
// pausing task can be stopped. A destination of stopped where want was
// something else is therefore always allowed (see movedAllowedSQL).
func stopDestinationSQL(want string) string {
	return `CASE WHEN t.status IN ` + activeStatusesSQL + `
           AND ` + want + ` IN ` + attemptEndsSQL + `
           AND (t.status = 'stopping' OR t.stop_requested)
      THEN 'stopped'
      WHEN t.status IN ` + activeStatusesSQL + `
           AND ` + want + ` IN ('retrying', 'queued')
           AND (t.status = 'pausing' OR t.pause_requested)
      THEN 'paused'
      ELSE ` + want + ` END`
}

// resumeDestinationSQL is task.ResumeDestination for a locked task row t:
// a paused pipeline step that still waits for dependencies, asked to move
// to queued or scheduled, goes back to pending.
func resumeDestinationSQL(want string) string {
	return `(CASE WHEN t.status = 'paused' AND t.deps_left > 0 AND ` + want + ` IN ('queued', 'scheduled')
      THEN 'pending' ELSE ` + want + ` END)`
}

// genericPlanSQL has the next statements of its transaction run on their
// generic plans, made once per connection, for statements whose plan no
// statistics can make wrong and whose planning at each call cost as much as
// running them (the connections' default is force_custom_plan: see New).
const genericPlanSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`

// movedAllowedSQL says whether the move from old to dest, requested as want,
// may be made: the table allows it ($from and $to are the table's pairs,
// allowedFrom and allowedTo), or it is a stop-wins redirect.
func movedAllowedSQL(old, dest, want, from, to string) string {
	return `((` + old + `, ` + dest + `) IN (SELECT * FROM unnest(` + from + `::text[], ` + to + `::text[]))
        OR (` + dest + ` = 'stopped' AND ` + want + ` <> 'stopped'))`
}

// eventInsertSQL inserts one audit event per row of the CTE src, which must
// have id, status_version, old_status, status, ev_node, epoch, attempt,
// reason and err.
func eventInsertSQL(src string) string {
	return `INSERT INTO flotilla_task_events
        (task_id, seq, from_status, to_status, at, node, epoch, attempt, reason, error)
    SELECT id, status_version, old_status, status, statement_timestamp(), ev_node, epoch, attempt, reason, err
    FROM ` + src
}

// ackLeftSQL returns a CTE named acked that answers the pending commands
// of every task that src (a CTE with id, old_status, status and ev_node)
// moved out of the active states or to a final state, in the same
// statement, as store.LeftOutcome words it: a stop honoured by a move to
// stopped is acknowledged "stopped", a pause honoured by a move to paused
// "paused"; any other command of a task that finished first is
// acknowledged "already finished: <status>", so that nobody waits on a
// command that can no longer apply. A data-modifying CTE runs whether or
// not the statement reads it.
//
// Commands are few and short-lived: mostly none is pending while a
// statement writes a thousand outcomes. So one probe first asks whether any
// command is pending at all, a one-time filter under the same snapshot as
// the join (so it finds whatever the join would); only then is each task
// moved looked up among the pending commands. Before, the thousand lookups
// that found nothing were about a twentieth of an outcome write.
func ackLeftSQL(src string) string {
	return `acked AS (
    UPDATE flotilla_commands cmd
    SET acked_at = statement_timestamp(), acked_by = coalesce(s.ev_node, ''),
        outcome = CASE WHEN s.status = 'stopped' AND cmd.kind = '` + store.CommandStop + `'
                       THEN '` + store.OutcomeStopped + `'
                       WHEN s.status = 'paused' AND cmd.kind = '` + store.CommandPause + `'
                       THEN '` + store.OutcomePaused + `'
                       WHEN s.status IN ` + terminalStatusesSQL + `
                       THEN '` + store.OutcomeFinishedPrefix + `' || s.status
                       ELSE 'not applied: the task is ' || s.status END
    FROM ` + src + ` s
    WHERE cmd.task_id = s.id
      AND (s.status IN ` + terminalStatusesSQL + `
           OR (s.old_status IN ` + activeStatusesSQL + ` AND s.status NOT IN ` + activeStatusesSQL + `))
      AND cmd.acked_at IS NULL
      AND EXISTS (SELECT 1 FROM flotilla_commands pending WHERE pending.acked_at IS NULL)
)`
}

// attemptIsCurrentSQL is the fence of every write about an active attempt,
// written once: the task row t (locked by the statement) is still active
// under the wanted claim_seq and owner, and owner still holds the task's
// bucket under the epoch of the claim. An expired bucket lease still passes
// (nobody can have taken the bucket, and so rescued the task, without
// raising the epoch) unless leaseCond asks more of the lease row bl, as a
// renewal does. The arguments are SQL expressions built from constants,
// never input.
func attemptIsCurrentSQL(t, wantSeq, owner, leaseCond string) string {
	cond := t + `.claim_seq = ` + wantSeq + `
      AND ` + t + `.owner = ` + owner + `
      AND ` + t + `.status IN ` + activeStatusesSQL + `
      AND EXISTS (SELECT 1 FROM flotilla_bucket_leases bl
                  WHERE bl.bucket = ` + t + `.bucket AND bl.owner = ` + owner + ` AND bl.epoch = ` + t + `.epoch`
	if leaseCond != "" {
		cond += `
                    AND ` + leaseCond
	}
	return cond + `)`
}

// resolveSQL returns the CTEs that release and skip, in the statement that
// ends them, the steps waiting for the pipeline tasks that fin (a SELECT of
// id, status, pipeline_id, ev_node and epoch of the tasks the statement
// moved) lists in a final state. The statement must be WITH RECURSIVE. The
// CTE released yields the steps moved, with their bucket and new status.
//
// Each pending dependent loses one dependency left per dependency ended
// here (direct); one whose policy does not accept how a dependency ended is
// skipped, with every descendant it reaches through steps still waiting
// (doomed, which walks the dependency table down from it and stops at a
// step that is not waiting: cancelled, queued, running or ended). The
// decrement is made on the locked row, so that a dependency ended by a
// concurrent transaction is counted once:
// the UPDATE waits for that transaction and applies to what it left. Tasks
// outside pipelines have no pipeline_id, so fin is empty for them and none
// of this reads a row.
//
// A step paused while pending (deps_left > 0) counts down and is skipped
// alike, but stays paused when its last dependency ends: resuming it queues
// it. A skip's audit event names the state it left, pending or paused, and
// RETURNING sees only the row after the UPDATE (PostgreSQL 15), so when the
// statement skips any step, held locks every dependent first and reads its
// status as it is then, even when a pause or resume committed while this
// statement waited for the row. When it skips none, held reads nothing: a
// step that only counts down tells its status before the UPDATE by its
// status after (paused stays paused; queued and pending were pending), and
// locking it first would write each row twice, a lock and a new version (a
// fan-out's release of 10,000 steps spent a sixth of its time in those
// locks). Either way the rows are locked in id order, by held's index scan
// or by the UPDATE reading plan sorted, so that two statements releasing
// steps of one diamond do not deadlock.
func resolveSQL(fin string) string {
	return `fin AS (
    SELECT f.* FROM (` + fin + `) f
    WHERE f.pipeline_id IS NOT NULL AND f.status IN ` + terminalStatusesSQL + `
), direct AS (
    -- One step ended (a fan-out's root, a chain's link): each dependent
    -- depends on it once, so there is nothing to group. One-time filters
    -- choose the branch; for a statement that ended no pipeline step,
    -- neither reads a row, whatever plan the planner chose.
    SELECT d.task_id AS id, 1 AS n,
           CASE WHEN NOT ` + acceptsSQL("d.on_policy", "f.status") + `
                THEN ` + dependencyEndReasonSQL("d.dep_step", "f.status", "d.on_policy") + ` END AS why,
           f.ev_node, f.epoch
    FROM fin f
    JOIN flotilla_task_deps d ON d.dep_id = f.id
    WHERE (SELECT count(*) FROM fin) = 1
    UNION ALL
    SELECT d.task_id, count(*)::int,
           min(CASE WHEN NOT ` + acceptsSQL("d.on_policy", "f.status") + `
                    THEN ` + dependencyEndReasonSQL("d.dep_step", "f.status", "d.on_policy") + ` END),
           min(f.ev_node), min(f.epoch)
    FROM fin f
    JOIN flotilla_task_deps d ON d.dep_id = f.id
    WHERE (SELECT count(*) FROM fin) > 1
    GROUP BY d.task_id
), doomed(id, why, ev_node, epoch) AS (
    -- The walk passes only through steps still waiting, which the skip
    -- reaches: one that ended (cancelled) or was released (queued,
    -- running) is not skipped, and its dependents owe it nothing. Each
    -- step's state is a scalar subquery, an index lookup per step
    -- walked, never a join the planner could hash.
    SELECT dr.id, dr.why, dr.ev_node, dr.epoch FROM direct dr
    WHERE dr.why IS NOT NULL
      AND coalesce((SELECT ` + waitsForDependenciesSQL("w") + ` FROM flotilla_tasks w WHERE w.id = dr.id), false)
    UNION
    -- Driven by the steps skipped so far: the lateral subquery, kept from
    -- being flattened (OFFSET 0), probes the dependency index for each. As
    -- a join, the planner scanned every dependency row of the table
    -- (each with its state's lookup) to hash against a work table that
    -- is empty in the common case: 10,000 lookups per completion batch of
    -- a 10,000-step fan-out.
    SELECT d.task_id, 'dependency ' || d.dep_step || ' was skipped', x.ev_node, x.epoch
    FROM doomed x
    CROSS JOIN LATERAL (SELECT dd.task_id, dd.dep_step FROM flotilla_task_deps dd WHERE dd.dep_id = x.id OFFSET 0) d
    WHERE coalesce((SELECT ` + waitsForDependenciesSQL("w") + ` FROM flotilla_tasks w WHERE w.id = d.task_id), false)
), plan AS (
    -- Nothing skipped, the common case: the plan is direct, without the
    -- join below (a one-time filter each), which hashed every dependent.
    SELECT id, why, n, ev_node, epoch FROM direct
    WHERE NOT EXISTS (SELECT 1 FROM doomed)
    UNION ALL
    SELECT coalesce(dm.id, dr.id) AS id, dm.why, coalesce(dr.n, 0) AS n,
           coalesce(dm.ev_node, dr.ev_node) AS ev_node, coalesce(dm.epoch, dr.epoch) AS epoch
    FROM (SELECT id, min(why) AS why, min(ev_node) AS ev_node, min(epoch) AS epoch FROM doomed GROUP BY id) dm
    FULL JOIN direct dr ON dr.id = dm.id
    WHERE EXISTS (SELECT 1 FROM doomed)
), held AS (
    SELECT t.id, t.status
    FROM flotilla_tasks t
    -- By id array, not a join with plan: the planner cannot count plan's
    -- rows, and a join it guessed at 200 hashed the whole task table on
    -- every batch of a fan-out's steps (a scan per batch, quadratic in the
    -- fan-out) where an index lookup per dependent is what it needs.
    WHERE t.id = ANY(ARRAY(SELECT id FROM plan WHERE EXISTS (SELECT 1 FROM plan WHERE why IS NOT NULL)))
      AND ` + waitsForDependenciesSQL("t") + `
      AND EXISTS (SELECT 1 FROM fin)
    FOR UPDATE OF t
), released AS (
    UPDATE flotilla_tasks t SET
        status = CASE WHEN p.why IS NOT NULL THEN 'skipped'
                      WHEN t.status = 'paused' THEN 'paused'
                      WHEN t.deps_left - p.n <= 0 THEN 'queued'
                      ELSE 'pending' END,
        status_version = t.status_version + CASE WHEN p.why IS NOT NULL
                                                   OR (t.status = 'pending' AND t.deps_left - p.n <= 0)
                                                 THEN 1 ELSE 0 END,
        deps_left = greatest(t.deps_left - p.n, 0),
        run_at = CASE WHEN p.why IS NULL AND t.status = 'pending' AND t.deps_left - p.n <= 0
                      THEN statement_timestamp() ELSE t.run_at END,
        finished_at = CASE WHEN p.why IS NOT NULL THEN statement_timestamp() END,
        updated_at = statement_timestamp()
    -- The UPDATE re-reads a row that changed while it waited for it and
    -- moves it only if it still waits for dependencies (and, when held
    -- locked the dependents, only the rows held found waiting). The id
    -- array keeps to an index lookup per dependent, as in held.
    FROM (SELECT * FROM plan ORDER BY id) p LEFT JOIN held h ON h.id = p.id
    WHERE t.id = ANY(ARRAY(SELECT id FROM plan)) AND t.id = p.id
      AND ` + waitsForDependenciesSQL("t") + `
      AND (h.id IS NOT NULL OR NOT EXISTS (SELECT 1 FROM held))
    RETURNING t.id, t.bucket, t.status, t.status_version, t.attempt, p.epoch,
              coalesce(h.status, CASE WHEN t.status = 'paused' THEN 'paused' ELSE 'pending' END) AS old_status,
              coalesce(p.why, '` + store.ReasonDependenciesMet + `') AS reason, ''::text AS err, p.ev_node
), released_ev AS (
    ` + eventInsertSQL(`released WHERE status <> old_status`) + `
)`
}

// waitsForDependenciesSQL says whether task row t still counts its
// dependencies down: it is pending, or was paused while pending with some
// left.
func waitsForDependenciesSQL(t string) string {
	return `(` + t + `.status = 'pending' OR (` + t + `.status = 'paused' AND ` + t + `.deps_left > 0))`
}

// acceptsSQL is task.Accepts in SQL: whether a dependency that ended in
// status lets a step with policy on run.
func acceptsSQL(on, status string) string {
	return `(CASE ` + on + `
        WHEN '` + task.OnAny + `' THEN ` + status + ` <> 'skipped'
        WHEN '` + task.OnFailure + `' THEN ` + status + ` NOT IN ('succeeded', 'skipped')
        ELSE ` + status + ` = 'succeeded' END)`
}

// dependencyEndReasonSQL is store.DependencyEndReason in SQL.
func dependencyEndReasonSQL(step, status, on string) string {
	return `CASE WHEN ` + status + ` = 'skipped' THEN 'dependency ' || ` + step + ` || ' was skipped'
         ELSE 'dependency ' || ` + step + ` || ' ended ' || ` + status + ` || '; this step runs on ' || ` + on + ` END`
}

// ints turns an int4 array read from the database into ints.
func ints(in []int32) []int {
	out := make([]int, len(in))
	for i, v := range in {
		out[i] = int(v)
	}
	return out
}
