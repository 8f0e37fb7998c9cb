package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// heldLeasesSQL is the held CTE of the claims (claimSQL, claimLimitedSQL):
// the buckets of $1 whose lease owner $2 holds, unexpired, under the epoch
// $7 names for each.
const heldLeasesSQL = `held AS (
    SELECT l.bucket, l.epoch
    FROM flotilla_bucket_leases l
    WHERE l.bucket = ANY($1::int[]) AND l.epoch = ($7::bigint[])[l.bucket + 1]
      AND l.owner = $2::text AND l.expires_at > statement_timestamp()
)`

// claimSQL claims in one statement: it keeps the requested buckets whose
// lease the caller holds, unexpired, under the epoch it names; picks and
// locks due claimable tasks of the given kinds in them, skipping rows that a
// concurrent claim has locked; moves them to running; and writes their
// events.
//
// The held buckets reach the task scan as an array (an InitPlan) tested
// while walking flotilla_tasks_claim_idx in claim order, which stops after
// $4 rows. Measured on PostgreSQL 15 with 1,000,000 finished and 50,000
// queued tasks over 64 buckets, claiming 100:
//
//	claim index (priority DESC, run_at, id), buckets as array filter:
//	    64 buckets held 0.5 ms, 2 of 64 held 1.8 ms
//	the same index, joined to the held buckets:
//	    the planner sorts every due row: 480 ms
//	(bucket, priority DESC, run_at, id), bucket = ANY(array):
//	    64 held 30 ms, 2 held 3.6 ms (bitmap scan + sort of the held backlog)
//	(bucket, priority DESC, run_at, id), joined to the held buckets:
//	    64 held 105 ms, 2 held 5.6 ms
//
// The bucket-leading index's cost grows with the caller's own backlog,
// which a busy node always has, so the claim index keeps the claim's order.
// Walking it, the claim passes the due tasks of buckets it does not hold
// that sort ahead of its own: with the bucket only in the table row, each of
// those cost a heap fetch, so a node's claim cost grew with the number of
// nodes sharing the fleet (1,024 buckets over 64 nodes: 2.8x the database
// CPU per task of 64 buckets over 2). The index therefore carries the
// bucket as its last key column (migration 6), and the claim bounds it by
// the lowest and highest held bucket: PostgreSQL tests that range on the
// index entry, so a row of a bucket outside it costs a key comparison, not
// a table read. (A bucket = ANY(array) condition on a column after the
// first is not tested in the index while keeping its order on PostgreSQL
// 15: the planner moves it to the filter.) A node holding a contiguous
// range of buckets (worker run --buckets 0-63) reads only its own rows; one
// holding scattered buckets reads the rows of the gaps between them, as
// before. With 200,000 finished and 100,000 queued tasks over 1,024
// buckets, 16 held of them, claiming 50: 1.2-2.9 ms without the range,
// 0.24-0.28 ms with it.
//
// held checks each lease by its bucket and looks the epoch named for it up
// in the epoch-by-bucket array ($7), the one the UPDATE stamps: no join.
// Joined to the unnest of the bucket and epoch arrays instead, a generic
// plan (the limited claim's when small, and a cached one) ran the unnest
// once per lease row, 64 times over 64: 0.9 ms of a 1.6 ms claim of one
// task under a fleet-wide limit.
//
// Tasks that need resources are left to the limited claim (ClaimLimited),
// the one that knows the node's capacity: the plain claim runs on nodes
// that declare none.
//
// The planner walks the index in order only if it believes there are many
// due rows. Right after a burst of inserts into a table whose statistics
// say it is empty, it believes there are a handful, and reads them all
// through a bitmap scan and sorts them: 17 ms instead of 0.2 ms for 20,000
// queued tasks, and seconds per claim for a million, until autovacuum's
// ANALYZE comes round. The claim therefore runs with enable_sort off (see
// claimBatch): the ordered index walk is then the only plan without a sort,
// and the statement needs no other sort (claimed rows are ordered in Go).
var claimSQL = `
WITH ` + heldLeasesSQL + `, picked AS (
    SELECT t.id, t.status AS old_status, t.bucket
    FROM flotilla_tasks t
    WHERE t.status IN ` + claimableStatusesSQL + `
      AND t.run_at <= statement_timestamp()
      AND t.kind = ANY($3::text[])
      AND t.bucket BETWEEN (SELECT min(bucket) FROM held) AND (SELECT max(bucket) FROM held)
      AND t.bucket = ANY(ARRAY(SELECT bucket FROM held))
      AND t.resources IS NULL
    ORDER BY t.priority DESC, t.run_at, t.id
    LIMIT $4
    FOR UPDATE OF t SKIP LOCKED
), claimed AS (
    UPDATE flotilla_tasks t SET
        status = 'running',
        status_version = t.status_version + 1,
        claim_seq = t.claim_seq + 1,
        attempt = t.attempt + 1,
        owner = $2::text,
        node = $5::text,
        -- The epoch the caller named for the task's bucket, which held
        -- has checked against the lease: a lookup by bucket number, where a
        -- join to held would cost a comparison per held bucket per task.
        epoch = ($7::bigint[])[p.bucket + 1],
        started_at = statement_timestamp(),
        lease_expires_at = statement_timestamp() + $6::bigint * interval '1 microsecond',
        updated_at = statement_timestamp()
    FROM picked p
    WHERE t.id = p.id
    RETURNING ` + taskColumnsOf("t") + `, p.old_status
), ev AS (
    ` + eventInsertSQL(`(SELECT id, status_version, old_status, status, node AS ev_node, epoch, attempt,
                              'claimed' AS reason, '' AS err FROM claimed) c`) + `
)
SELECT ` + taskColumns + ` FROM claimed`

// claimSettingSQL sets what the claim runs under, for its transaction only:
// enable_sort off (above); a statement timeout ($1, in milliseconds; 0 for
// none) so that the database rolls back a claim whose caller is about to
// give up on it, instead of committing tasks the caller never hears of;
// and its generic plan, made once per connection. Planning the claim for
// each call's values cost 0.3-0.7 ms, as much as running it: a tenth of
// the database's time in a burn-down. With sorts off the ordered walk of
// the claim index is the one plan the planner can choose, whatever the
// statistics say when a connection makes it (an empty table, a deep
// backlog, statistics that have not seen the queued rows):
// TestClaimUsesTheClaimIndex holds it there. Sequential scans are off too:
// made for an array of buckets it does not know, the generic plan read the
// lease table whole, every bucket of the fleet at each claim of each node
// (0.15 ms of a 0.18 ms claim that found nothing, holding 16 buckets of
// 1,024), where the held ones are a probe each of its primary key.
const claimSettingSQL = `SELECT set_config('enable_sort', 'off', true), set_config('statement_timeout', $1::text, true),
       set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)`

// claimBatch runs claimSQL in a transaction with enable_sort off, pipelined
// in one round trip.
func claimBatch(timeoutMillis int64, args ...any) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(claimSettingSQL, strconv.FormatInt(timeoutMillis, 10))
	b.Queue(claimSQL, args...)
	b.Queue("COMMIT")
	return b
}

// ClaimTasks moves up to req.Limit due tasks of the held buckets to running
// for req.Owner.
func (s *Store) ClaimTasks(ctx context.Context, req store.ClaimRequest) ([]*task.Task, error) {
	if req.Owner == "" {
		return nil, fmt.Errorf("claim tasks: no owner: %w", store.ErrInvalid)
	}
	if req.LeaseTTL <= 0 {
		return nil, fmt.Errorf("claim tasks: task lease TTL %v is not positive: %w", req.LeaseTTL, store.ErrInvalid)
	}
	if len(req.Kinds) == 0 || len(req.Buckets) == 0 || req.Limit <= 0 {
		return nil, nil
	}
	h, err := heldArraysOf(req.Buckets)
	if err != nil {
		return nil, err
	}
	return s.sendClaim(ctx, claimBatch(statementMillis(ctx), h.buckets, req.Owner, req.Kinds, req.Limit,
		req.Node, micros(req.LeaseTTL), h.epochByBucket), scanTasks)
}

// sendClaim sends a claim's batch (BEGIN, its settings, the claim, COMMIT)
// and returns what it claimed, in claim order.
func (s *Store) sendClaim(ctx context.Context, b *pgx.Batch, scan func(pgx.Rows) ([]*task.Task, error)) ([]*task.Task, error) {
	br := s.pool.SendBatch(ctx, b)
	out, err := readClaimBatch(br, scan)
	// On an error the connection is left in a failed transaction, and the
	// pool closes it rather than reuse it.
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, wrap(err, "claim tasks")
	}
	sortClaimed(out)
	return out, nil
}

// heldArrays are a claim's held buckets as its statement takes them.
type heldArrays struct {
	buckets []int32
	// epochByBucket[b] is the epoch named for bucket b (index b+1 in SQL).
	epochByBucket []int64
}

// heldArraysOf checks the held buckets and arranges them for a claim, each
// bucket once.
func heldArraysOf(held []store.HeldBucket) (heldArrays, error) {
	top := -1
	for _, h := range held {
		if h.Bucket < 0 || h.Bucket >= bucket.MaxCount {
			return heldArrays{}, fmt.Errorf("claim tasks: bucket %d does not exist: %w", h.Bucket, store.ErrInvalid)
		}
		top = max(top, h.Bucket)
	}
	out := heldArrays{buckets: make([]int32, 0, len(held)), epochByBucket: make([]int64, top+1)}
	named := make([]bool, top+1)
	for _, h := range held {
		if !named[h.Bucket] {
			named[h.Bucket] = true
			out.buckets = append(out.buckets, int32(h.Bucket))
			out.epochByBucket[h.Bucket] = h.Epoch
		}
	}
	return out, nil
}

// statementMillis is the statement timeout of a claim: half the caller's
// remaining time, the rest for the answer to come back; 0 (none) without
// a deadline.
func statementMillis(ctx context.Context) int64 {
	if deadline, ok := ctx.Deadline(); ok {
		return max(1, time.Until(deadline).Milliseconds()/2)
	}
	return 0
}

// readClaimBatch reads a claim's batch: BEGIN, its settings, the claim
// (its rows read by scan), COMMIT.
func readClaimBatch(br pgx.BatchResults, scan func(pgx.Rows) ([]*task.Task, error)) ([]*task.Task, error) {
	if _, err := br.Exec(); err != nil { // BEGIN
		return nil, err
	}
	return readClaimed(br, scan)
}

// readClaimed reads a claim's settings, the claim, and COMMIT.
func readClaimed(br pgx.BatchResults, scan func(pgx.Rows) ([]*task.Task, error)) ([]*task.Task, error) {
	if _, err := br.Exec(); err != nil { // the settings
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	out, err := scan(rows)
	if err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil { // COMMIT
		return nil, err
	}
	return out, nil
}

// sortClaimed puts claimed tasks in claim order: priority descending, then
// run_at, then id. The claim statements return them unsorted, so that they
// need no sort of their own.
func sortClaimed(out []*task.Task) {
	slices.SortFunc(out, func(a, b *task.Task) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.RunAt.Compare(b.RunAt), cmp.Compare(a.ID, b.ID))
	})
}

// renewSQL extends the task leases of the named attempts that are active,
// owned by $1, and whose bucket lease $1 holds, unexpired, under the task's
// epoch. Rows are locked in id order, one primary-key probe each, so that
// a renewal and a batch of completions of the same node never deadlock; a
// row another transaction holds is skipped, not waited for, and answered
// busy (it exists, but was not locked). Each input is answered: renewed,
// busy, or neither (lost).
var renewSQL = `
WITH r AS (
    SELECT * FROM unnest($2::bigint[], $3::bigint[]) AS r(id, claim_seq)
), locked AS (
    SELECT t.id, t.status, t.claim_seq, t.owner, t.bucket, t.epoch, r.claim_seq AS want_seq
    FROM (SELECT * FROM r ORDER BY id) r
    CROSS JOIN LATERAL (
        SELECT id, status, claim_seq, owner, bucket, epoch
        FROM flotilla_tasks WHERE id = r.id
        LIMIT 1 -- keeps the conditions below out of this scan
        FOR UPDATE SKIP LOCKED
    ) t
), live AS (
    SELECT l.id
    FROM locked l
    WHERE ` + attemptIsCurrentSQL("l", "l.want_seq", "$1::text", "bl.expires_at > statement_timestamp()") + `
), renewed AS (
    UPDATE flotilla_tasks t
    SET lease_expires_at = statement_timestamp() + $4::bigint * interval '1 microsecond',
        updated_at = statement_timestamp()
    FROM live
    WHERE t.id = live.id
    RETURNING t.id
)
SELECT r.id, r.claim_seq, n.id IS NOT NULL,
       -- Skipped by the lock, though the row is there: busy.
       l.id IS NULL AND EXISTS (SELECT 1 FROM flotilla_tasks x WHERE x.id = r.id)
FROM r
LEFT JOIN renewed n ON n.id = r.id
LEFT JOIN locked l ON l.id = r.id`

// RenewTaskLeases extends, in one statement, the leases of the named
// attempts that owner still holds, and says which it renewed and which it
// found locked.
func (s *Store) RenewTaskLeases(ctx context.Context, owner string, refs []task.Ref, ttl time.Duration) (store.Renewal, error) {
	if ttl <= 0 {
		return store.Renewal{}, fmt.Errorf("renew task leases: TTL %v is not positive: %w", ttl, store.ErrInvalid)
	}
	if len(refs) == 0 {
		return store.Renewal{}, nil
	}
	ids := make([]int64, len(refs))
	seqs := make([]int64, len(refs))
	for i, r := range refs {
		ids[i], seqs[i] = r.ID, r.ClaimSeq
	}
	rows, err := s.pool.Query(ctx, renewSQL, owner, ids, seqs, micros(ttl))
	if err != nil {
		return store.Renewal{}, wrap(err, "renew %d task leases", len(refs))
	}
	defer rows.Close()
	var out store.Renewal
	for rows.Next() {
		var (
			r             task.Ref
			renewed, busy bool
		)
		if err := rows.Scan(&r.ID, &r.ClaimSeq, &renewed, &busy); err != nil {
			return store.Renewal{}, wrap(err, "renew %d task leases", len(refs))
		}
		switch {
		case renewed:
			out.Renewed = append(out.Renewed, r)
		case busy:
			out.Busy = append(out.Busy, r)
		}
	}
	if err := rows.Err(); err != nil {
		return store.Renewal{}, wrap(err, "renew %d task leases", len(refs))
	}
	return out, nil
}

// advanceSQL applies a batch of fenced transitions in one statement. cur
// keeps the inputs whose fence holds (active, same claim_seq, owned by $1,
// and $1 holds the bucket under the task's epoch: expired or not, nobody
// can have taken it without raising the epoch), locked in id order, with
// the destination after the pending-stop rule; moved applies those the table
// allows and writes their events. The last SELECT answers every input in
// order, with what it needs to explain a refusal.
var advanceSQL = `
WITH RECURSIVE b AS (
    SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
                         $8::text[], $9::bigint[], $10::text[])
         WITH ORDINALITY AS b(id, claim_seq, want, reason, err, result, progress, delay_us, node, ord)
), cur AS (
    -- The lateral subquery holds FOR UPDATE, so it is not flattened into a
    -- join, and it has no condition but the id: each input is one
    -- primary-key probe, in id order, whatever the statistics say (with a
    -- status condition beside it, a planner that believes few tasks are
    -- active scans the whole active-rows index for each input). The fence
    -- is checked on the locked, latest row version.
    SELECT t.id, t.status AS old_status, ` + stopDestinationSQL("b.want") + ` AS dest,
           b.want, b.ord, b.reason, b.err, b.result, b.progress, b.delay_us, b.node
    FROM (SELECT * FROM b ORDER BY id) b
    CROSS JOIN LATERAL (
        SELECT id, status, claim_seq, owner, bucket, epoch, stop_requested, pause_requested
        FROM flotilla_tasks WHERE id = b.id
        LIMIT 1 -- keeps the conditions below out of this scan
        FOR UPDATE
    ) t
    WHERE ` + attemptIsCurrentSQL("t", "b.claim_seq", "$1::text", "") + `
), moved AS (
    UPDATE flotilla_tasks t SET ` + transitionSetSQL + `,
        result = coalesce(c.result::jsonb, t.result),
        progress = coalesce(c.progress::jsonb, t.progress)
    FROM cur c
    WHERE t.id = c.id
      AND ` + movedAllowedSQL("c.old_status", "c.dest", "c.want", "$11", "$12") + `
    RETURNING t.id, t.bucket, t.status, t.status_version, t.attempt, t.epoch, c.old_status, c.reason, c.err,
              c.node AS ev_node, c.ord, t.pipeline_id
), ev AS (
    ` + eventInsertSQL("moved") + `
), ` + ackLeftSQL("moved") + `, ` + resolveSQL(`SELECT id, status, pipeline_id, ev_node, epoch FROM moved`) + `
SELECT b.ord, m.status, m.bucket, c.old_status, c.dest,
       -- Only for inputs that were fenced or name no task.
       CASE WHEN c.ord IS NULL THEN (SELECT status FROM flotilla_tasks WHERE id = b.id) END,
       -- The buckets of the steps this statement released, on the first
       -- row only.
       CASE WHEN b.ord = 1 THEN (SELECT array_agg(DISTINCT bucket) FROM released WHERE status = 'queued') END
FROM b
LEFT JOIN cur c ON c.ord = b.ord
LEFT JOIN moved m ON m.ord = b.ord
ORDER BY b.ord`

// advanceChunk is the most transitions sent in one statement.
const advanceChunk = 1000

// AdvanceActive applies a batch of fenced transitions and answers each in
// input order.
func (s *Store) AdvanceActive(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	if err := checkTransitions(batch); err != nil {
		return nil, err
	}
	out := make([]store.Outcome, 0, len(batch))
	for start := 0; start < len(batch); {
		// A chunk ends before a task it already names: the same task twice
		// in one statement would be updated once, so its second transition
		// goes in the next statement, after the first has applied.
		end := start
		seen := make(map[int64]bool)
		for end < len(batch) && end-start < advanceChunk && !seen[batch[end].Ref.ID] {
			seen[batch[end].Ref.ID] = true
			end++
		}
		outcomes, err := s.advance(ctx, owner, batch[start:end])
		if err != nil {
			return nil, err
		}
		out = append(out, outcomes...)
		start = end
	}
	return out, nil
}

// checkTransitions refuses a batch the database would refuse, naming the
// first bad transition, before anything is sent.
func checkTransitions(batch []store.ActiveTransition) error {
	for i, at := range batch {
		if !at.To.Valid() {
			return fmt.Errorf("transition %d (task %d): unknown status %q: %w", i, at.Ref.ID, at.To, store.ErrInvalid)
		}
		if !validJSON(at.Result) {
			return fmt.Errorf("transition %d (task %d): result is not valid JSON: %w", i, at.Ref.ID, store.ErrInvalid)
		}
		if !validJSON(at.Progress) {
			return fmt.Errorf("transition %d (task %d): progress is not valid JSON: %w", i, at.Ref.ID, store.ErrInvalid)
		}
	}
	return nil
}

func (s *Store) advance(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	for _, at := range batch {
		if len(at.Append) > 0 {
			return s.advanceAppending(ctx, owner, batch)
		}
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	queueAdvance(b, owner, batch)
	b.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, b)
	out, claimable, err := readAdvance(br, owner, batch)
	if err == nil {
		_, err = br.Exec() // COMMIT
	}
	// On an error the connection is left in a failed transaction, and the
	// pool closes it rather than reuse it.
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, wrap(err, "advance %d tasks", len(batch))
	}
	s.announce(ctx, claimable)
	return out, nil
}

// queueAdvance adds to b, inside a transaction, the statements that apply
// batch: one chunk, with no task twice and nothing to append. The rows are
// locked first, in a statement of their own, so that the advance
// statement's snapshot is taken once it holds them: a stop issued while
// the completion waited for a row (its command row committed with the
// row's lock) is then seen by the acknowledgements too, not only by the
// locked row's stop_requested.
func queueAdvance(b *pgx.Batch, owner string, batch []store.ActiveTransition) {
	n := len(batch)
	var (
		ids, seqs, delays           = make([]int64, n), make([]int64, n), make([]int64, n)
		wants, reasons, errs, nodes = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		results, progress           = make([]pgtype.Text, n), make([]pgtype.Text, n)
	)
	for i, at := range batch {
		ids[i], seqs[i], delays[i] = at.Ref.ID, at.Ref.ClaimSeq, micros(at.Delay)
		wants[i], reasons[i], errs[i], nodes[i] = string(at.To), at.Reason, at.Error, at.Node
		results[i], progress[i] = jsonText(at.Result), jsonText(at.Progress)
	}
	b.Queue(advanceSettingSQL)
	b.Queue(lockTasksSQL, ids)
	b.Queue(advanceSQL, owner, ids, seqs, wants, reasons, errs, results, progress, delays, nodes, allowedFrom, allowedTo)
}

// AdvanceAndClaimLimited writes the outcomes and claims in one
// transaction: BEGIN, the advance's three statements, the claim's two
// (its settings, which also set its own plan settings, then the claim), and
// COMMIT go in one round trip. Whatever fails, the transaction writes
// nothing.
func (s *Store) AdvanceAndClaimLimited(ctx context.Context, owner string, batch []store.ActiveTransition,
	req store.ClaimRequest, lc store.LimitedClaim) ([]store.Outcome, []*task.Task, error) {
	if err := checkTransitions(batch); err != nil {
		return nil, nil, err
	}
	if err := store.CheckOneWrite(batch); err != nil {
		return nil, nil, err
	}
	if len(batch) > advanceChunk {
		return nil, nil, fmt.Errorf("%d transitions, more than the %d of one statement: %w", len(batch), advanceChunk, store.ErrInvalid)
	}
	q, err := limitedClaimOf(ctx, req, lc)
	if err != nil {
		return nil, nil, err
	}
	if q == nil || len(batch) == 0 {
		out, err := s.AdvanceActive(ctx, owner, batch)
		if err != nil || q == nil {
			return out, nil, err
		}
		claimed, err := s.ClaimLimited(ctx, req, lc)
		return out, claimed, err
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	queueAdvance(b, owner, batch)
	q.queue(b)
	b.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, b)
	out, claimable, err := readAdvance(br, owner, batch)
	var claimed []*task.Task
	if err == nil {
		claimed, err = readClaimed(br, scanLimitedTasks)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, wrap(err, "advance %d tasks and claim", len(batch))
	}
	s.announce(ctx, claimable)
	sortClaimed(claimed)
	return out, claimed, nil
}

// advanceSettingSQL has the lock and advanceSQL run on their cached
// generic plans, made without sequential scans. Their parameters are
// arrays whose values change nothing in their plans (each input is one
// primary-key probe), while planning them afresh for each call, as the
// plan cache does while it judges a custom plan no worse, costs more than
// the statement's work: measured on the plain burn-down, database CPU per
// task fell from 117 to 103 µs (medians of 3, alternated runs;
// docs/benchmarks.md). A generic plan is kept for the connection's life,
// until statistics change; a node's connections make theirs on their
// first write, often on a table of a page or two and never analyzed, where
// a scan of the table is the cheaper plan. Kept while the table grew to a
// million rows on a server without autovacuum, that scan held a node to
// 240 tasks a second. With sequential scans off, every plan these
// statements get is the one that stays right as the table grows.
const advanceSettingSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)`

// lockTasksSQL locks the named tasks' rows in id order, the order every
// writer of several tasks locks them in.
const lockTasksSQL = `SELECT id FROM flotilla_tasks WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE`

// readAdvance reads the answers of advanceSQL from its batch, up to the
// statement after it.
func readAdvance(br pgx.BatchResults, owner string, batch []store.ActiveTransition) ([]store.Outcome, []int, error) {
	n := len(batch)
	for range 3 { // BEGIN, the settings, the lock
		if _, err := br.Exec(); err != nil {
			return nil, nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	out := make([]store.Outcome, 0, n)
	var claimable []int
	for rows.Next() {
		var (
			ord                            int64
			moved, from, dest, statusAfter pgtype.Text
			movedBucket                    pgtype.Int4
			released                       []int32
		)
		if err := rows.Scan(&ord, &moved, &movedBucket, &from, &dest, &statusAfter, &released); err != nil {
			return nil, nil, err
		}
		claimable = append(claimable, ints(released)...)
		at := batch[ord-1]
		o := store.Outcome{ID: at.Ref.ID}
		switch {
		case moved.Valid:
			o.Status = task.Status(moved.String)
			if claimableNow(o.Status, at.Delay) {
				claimable = append(claimable, int(movedBucket.Int32))
			}
		case from.Valid:
			o.Status = task.Status(from.String)
			o.Err = &task.TransitionError{ID: at.Ref.ID, From: task.Status(from.String), To: task.Status(dest.String)}
		case statusAfter.Valid:
			o.Status = task.Status(statusAfter.String)
			o.Err = fmt.Errorf("task %d attempt %d (owner %s): %w", at.Ref.ID, at.Ref.ClaimSeq, owner, store.ErrFenced)
		default:
			o.Err = fmt.Errorf("task %d: %w", at.Ref.ID, store.ErrNotFound)
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if len(out) != n {
		return nil, nil, fmt.Errorf("%d answers", len(out))
	}
	rows.Close()
	return out, claimable, nil
}

// saveProgressSQL is fenced like advanceSQL, and answers whether the task
// exists and whether the write applied. It changes no indexed column, so it
// can be a HOT update.
var saveProgressSQL = `
WITH t AS (
    SELECT id, status, claim_seq, owner, bucket, epoch
    FROM flotilla_tasks WHERE id = $2
    LIMIT 1 -- a primary-key probe, whatever the statistics say
    FOR UPDATE
), saved AS (
    UPDATE flotilla_tasks u
    SET progress = coalesce($4::jsonb, 'null'), updated_at = statement_timestamp()
    FROM t
    WHERE u.id = t.id AND ` + attemptIsCurrentSQL("t", "$3", "$1::text", "") + `
    RETURNING u.id
)
SELECT EXISTS (SELECT 1 FROM t), EXISTS (SELECT 1 FROM saved)`

// SaveProgress records a running attempt's progress.
func (s *Store) SaveProgress(ctx context.Context, owner string, ref task.Ref, progress json.RawMessage) error {
	if !validJSON(progress) {
		return fmt.Errorf("task %d: progress is not valid JSON: %w", ref.ID, store.ErrInvalid)
	}
	var exists, saved bool
	if err := s.pool.QueryRow(ctx, saveProgressSQL, owner, ref.ID, ref.ClaimSeq, jsonText(progress)).Scan(&exists, &saved); err != nil {
		return wrap(err, "save progress of task %d", ref.ID)
	}
	switch {
	case saved:
		return nil
	case !exists:
		return fmt.Errorf("save progress of task %d: %w", ref.ID, store.ErrNotFound)
	default:
		return fmt.Errorf("save progress of task %d attempt %d (owner %s): %w", ref.ID, ref.ClaimSeq, owner, store.ErrFenced)
	}
}

// expiredSQL lists active tasks of the given buckets whose task lease has
// expired, or that were claimed under an epoch older than the caller's. It
// probes the active-rows index once per bucket: the lateral subquery names
// its bucket, and its LIMIT keeps the planner from flattening it into a
// join, which, planned for a table it believed small, hashed the whole
// index, every running task of the fleet (see expiredSettingSQL).
var expiredSQL = `
SELECT ` + taskColumnsOf("t") + `
FROM unnest($1::int[], $2::bigint[]) AS h(bucket, epoch)
CROSS JOIN LATERAL (
    SELECT * FROM flotilla_tasks
    WHERE bucket = h.bucket
      AND status IN ` + activeStatusesSQL + `
      AND (lease_expires_at <= statement_timestamp() OR epoch < h.epoch)
    LIMIT $3
) t
ORDER BY t.id
LIMIT $3`

// expiredSettingSQL has expiredSQL, which every node sends at each
// acquisition and every ReconcileInterval, run on its generic plan: one
// probe of the active-rows index per held bucket, whatever the table held
// when a connection made it (TestTheExpiredTasksReadProbesEachHeldBucket;
// the lateral form needs no scan turned off for it).
const expiredSettingSQL = genericPlanSQL

// ExpiredTasks lists active tasks in the given buckets whose task lease has
// expired by the database clock or whose epoch is older than the one named.
func (s *Store) ExpiredTasks(ctx context.Context, buckets []store.HeldBucket, limit int) ([]*task.Task, error) {
	if len(buckets) == 0 {
		return nil, nil
	}
	if limit <= 0 {
		limit = DefaultScanLimit
	}
	nums := make([]int32, 0, len(buckets))
	epochs := make([]int64, 0, len(buckets))
	seen := make(map[int]bool, len(buckets))
	for _, h := range buckets {
		if !seen[h.Bucket] {
			seen[h.Bucket] = true
			nums = append(nums, int32(h.Bucket))
			epochs = append(epochs, h.Epoch)
		}
	}
	var out []*task.Task
	err := s.readOnItsPlan(ctx, expiredSettingSQL, expiredSQL, []any{nums, epochs, limit}, func(rows pgx.Rows) error {
		var err error
		out, err = scanTasks(rows)
		return err
	})
	if err != nil {
		return nil, wrap(err, "list expired tasks")
	}
	return out, nil
}

// DefaultScanLimit bounds ExpiredTasks and DueSchedules when the caller
// names no limit.
const DefaultScanLimit = 100

// backlogSQL counts, per bucket, the rows of the claim and active partial
// indexes only, one branch per index (a single WHERE over both state lists
// matches neither index's predicate, and PostgreSQL scans the whole table):
// finished tasks are never read.
var backlogSQL = `
SELECT bucket, sum(queued)::bigint, sum(waiting)::bigint, sum(active)::bigint, min(oldest_due)
FROM (
    SELECT bucket,
           count(*) FILTER (WHERE run_at <= statement_timestamp()) AS queued,
           count(*) FILTER (WHERE run_at > statement_timestamp()) AS waiting,
           0 AS active,
           min(run_at) FILTER (WHERE run_at <= statement_timestamp()) AS oldest_due
    FROM flotilla_tasks
    WHERE status IN ` + claimableStatusesSQL + `
    GROUP BY bucket
    UNION ALL
    SELECT bucket, 0, 0, count(*), NULL::timestamptz
    FROM flotilla_tasks
    WHERE status IN ` + activeStatusesSQL + `
    GROUP BY bucket
) counts
GROUP BY bucket
ORDER BY bucket`

// BucketBacklog counts queued, waiting and active tasks per bucket that has
// any.
func (s *Store) BucketBacklog(ctx context.Context) ([]store.Backlog, error) {
	rows, err := s.pool.Query(ctx, backlogSQL)
	if err != nil {
		return nil, wrap(err, "count the backlog")
	}
	defer rows.Close()
	var out []store.Backlog
	for rows.Next() {
		var (
			b                       int32
			queued, waiting, active int64
			oldest                  *time.Time
		)
		if err := rows.Scan(&b, &queued, &waiting, &active, &oldest); err != nil {
			return nil, wrap(err, "count the backlog")
		}
		bl := store.Backlog{Bucket: int(b), Queued: int(queued), Waiting: int(waiting), Active: int(active)}
		if oldest != nil {
			bl.OldestDue = *oldest
		}
		out = append(out, bl)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "count the backlog")
	}
	return slices.Clip(out), nil
}
