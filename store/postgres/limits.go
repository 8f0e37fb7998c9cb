package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

const limitSelectColumns = `name, kind, per, concurrency, rate, period_ms, burst, created_at, updated_at`

func scanLimit(row pgx.Row) (store.Limit, error) {
	var l store.Limit
	var conc, rate, burst int32
	var periodMS int64
	if err := row.Scan(&l.Name, &l.Kind, &l.Per, &conc, &rate, &periodMS, &burst, &l.CreatedAt, &l.UpdatedAt); err != nil {
		return store.Limit{}, err
	}
	l.Concurrency, l.Rate, l.Burst = int(conc), int(rate), int(burst)
	l.Period = time.Duration(periodMS) * time.Millisecond
	l.CreatedAt, l.UpdatedAt = l.CreatedAt.UTC(), l.UpdatedAt.UTC()
	return l, nil
}

const upsertLimitSQL = `
INSERT INTO flotilla_limits (name, kind, per, concurrency, rate, period_ms, burst, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, statement_timestamp(), statement_timestamp())
ON CONFLICT (name) DO UPDATE SET
    kind = EXCLUDED.kind, per = EXCLUDED.per, concurrency = EXCLUDED.concurrency, rate = EXCLUDED.rate,
    period_ms = EXCLUDED.period_ms, burst = EXCLUDED.burst, updated_at = EXCLUDED.updated_at
RETURNING ` + limitSelectColumns

// UpsertLimit creates or replaces a limit.
func (s *Store) UpsertLimit(ctx context.Context, l store.Limit) (store.Limit, error) {
	if err := store.CheckLimit(l); err != nil {
		return store.Limit{}, fmt.Errorf("limit %s: %w", store.Shorten(l.Name, 60), err)
	}
	out, err := scanLimit(s.pool.QueryRow(ctx, upsertLimitSQL, l.Name, l.Kind, l.Per, int32(l.Concurrency),
		int32(l.Rate), l.Period.Milliseconds(), int32(l.Burst)))
	if err != nil {
		return store.Limit{}, wrap(err, "save limit %s", store.Shorten(l.Name, 60))
	}
	return out, nil
}

// ListLimits returns every limit by name.
func (s *Store) ListLimits(ctx context.Context) ([]store.Limit, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+limitSelectColumns+` FROM flotilla_limits ORDER BY name`)
	if err != nil {
		return nil, wrap(err, "list limits")
	}
	defer rows.Close()
	out := []store.Limit{}
	for rows.Next() {
		l, err := scanLimit(rows)
		if err != nil {
			return nil, wrap(err, "list limits")
		}
		out = append(out, l)
	}
	return out, wrap(rows.Err(), "list limits")
}

// DeleteLimit removes a limit; its shares go with it (ON DELETE CASCADE).
func (s *Store) DeleteLimit(ctx context.Context, name string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM flotilla_limits WHERE name = $1`, name)
	if err != nil {
		return wrap(err, "delete limit %s", store.Shorten(name, 60))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("delete limit %s: %w", store.Shorten(name, 60), store.ErrNotFound)
	}
	return nil
}

// limitKeySQL is a task's effective limit key (store.LimitKeyOf).
const limitKeySQL = `CASE WHEN t.limit_key = '' THEN t.key ELSE t.limit_key END`

// claimLimitedSQL is claimSQL for a holder with limits (see
// store.LimitedClaim). It walks the claim index as claimSQL does, leaving
// out closed kinds ($8) and closed keys ($9, as kind || chr(31) || key: a
// NOT IN over a subquery, which PostgreSQL hashes, so ten thousand closed
// keys cost a probe per row, not a scan of the list), and stops at $10
// candidates; a second walk does the same leaving out the busy keys ($19)
// and the keys of the first walk's candidates, so that keys queued behind
// one key's backlog are seen. The second walk is skipped (a one-time
// filter: its scan never runs) when the first walk already holds $4
// candidates that none of it could precede (sure): over many keys of a
// few tasks each, the common case, it would lock as many rows again for
// nothing. A sure candidate is the first of its key among the first walk's,
// of a key not named (turn 0, none used), of a kind with no room of its own
// and room for such a key, and needs no resource: it is picked in claim
// order ahead of any other, and the second walk's candidates come after the
// first's in claim order (when the first walk stops short of $10, there are
// none). When moreover nothing else could come as early in the round
// robin ($21, sureDecides), the first $4 sure candidates in claim order are
// the claim, taken without ranking: a one-time filter keeps the ranking's
// CTEs from running, which were a fifth of such a claim's execution.
// Otherwise, over those few it ranks each candidate within its key and its
// kind, sums each resource in round-robin order, and takes what the rooms
// and the sums allow in round-robin order: the key's turn ($20) plus the candidate's rank
// within its key, then fewest used. It bounds the buckets by the held range
// on the claim index as claimSQL does. claimSQL itself reads no limit: a
// fleet without limits pays nothing for them.
var claimLimitedSQL = `
WITH ` + heldLeasesSQL + `, cand AS (
    SELECT t.id, t.status AS old_status, t.bucket, t.kind, t.priority, t.run_at, t.resources,
           ` + limitKeySQL + ` AS lk
    FROM flotilla_tasks t
    WHERE t.status IN ` + claimableStatusesSQL + `
      AND t.run_at <= statement_timestamp()
      AND t.kind = ANY($3::text[])
      AND t.bucket BETWEEN (SELECT min(bucket) FROM held) AND (SELECT max(bucket) FROM held)
      AND t.bucket = ANY(ARRAY(SELECT bucket FROM held))
      AND t.kind <> ALL($8::text[])
      AND (t.kind || chr(31) || ` + limitKeySQL + `) NOT IN (SELECT unnest($9::text[]))
    ORDER BY t.priority DESC, t.run_at, t.id
    LIMIT $10
    FOR UPDATE OF t SKIP LOCKED
), sure AS (
    SELECT f.id
    FROM (SELECT DISTINCT ON (c.kind, c.lk) c.id, c.kind, c.lk, c.resources
          FROM cand c ORDER BY c.kind, c.lk, c.priority DESC, c.run_at, c.id) f
    WHERE f.resources IS NULL
      AND (f.kind || chr(31) || f.lk) <> ALL($13::text[])
      AND NOT EXISTS (SELECT 1 FROM unnest($16::text[], $17::int[], $18::int[]) AS kr(kind, room, key_room)
                      WHERE kr.kind = f.kind AND (kr.room >= 0 OR kr.key_room = 0))
), fresh AS (
    SELECT t.id, t.status AS old_status, t.bucket, t.kind, t.priority, t.run_at, t.resources,
           ` + limitKeySQL + ` AS lk
    FROM flotilla_tasks t
    WHERE t.status IN ` + claimableStatusesSQL + `
      AND t.run_at <= statement_timestamp()
      AND t.kind = ANY($3::text[])
      AND t.bucket BETWEEN (SELECT min(bucket) FROM held) AND (SELECT max(bucket) FROM held)
      AND t.bucket = ANY(ARRAY(SELECT bucket FROM held))
      AND t.kind <> ALL($8::text[])
      AND (t.kind || chr(31) || ` + limitKeySQL + `) NOT IN (SELECT unnest($9::text[]))
      AND (t.kind || chr(31) || ` + limitKeySQL + `) NOT IN (SELECT unnest($19::text[]))
      AND (t.kind || chr(31) || ` + limitKeySQL + `) NOT IN (SELECT c.kind || chr(31) || c.lk FROM cand c)
      AND (SELECT count(*) FROM sure) < $4
    ORDER BY t.priority DESC, t.run_at, t.id
    LIMIT $10
    FOR UPDATE OF t SKIP LOCKED
), ranked AS (
    -- Candidates needing more than the node has in all ($22, $23, when
    -- $24) never start here: they are left out before the ranking, so
    -- that they take no place in their key's or kind's room nor in any
    -- running sum.
    SELECT c.*,
           row_number() OVER (PARTITION BY c.kind, c.lk ORDER BY c.priority DESC, c.run_at, c.id) - 1 AS key_rank,
           row_number() OVER (PARTITION BY c.kind ORDER BY c.priority DESC, c.run_at, c.id) - 1 AS kind_rank,
           row_number() OVER (ORDER BY c.priority DESC, c.run_at, c.id) AS pos
    FROM (SELECT * FROM cand UNION SELECT * FROM fresh) c
    WHERE NOT ($24::bool AND c.resources IS NOT NULL AND EXISTS (
        SELECT 1 FROM jsonb_each_text(c.resources) AS y(name, amount)
        LEFT JOIN unnest($22::text[], $23::bigint[]) AS cap(name, amount) ON cap.name = y.name
        WHERE y.amount::bigint > coalesce(cap.amount, 0)))
), turned AS (
    -- Each candidate's place in the round robin: the key's turn plus its
    -- rank within its key, then the key's use, then claim order.
    SELECT r.*, coalesce(k.turn, 0) + r.key_rank AS rr, coalesce(k.used, 0) AS key_used,
           coalesce(k.room, kr.key_room, -1) AS key_room, coalesce(kr.room, -1) AS kind_room
    FROM ranked r
    LEFT JOIN unnest($13::text[], $14::int[], $15::int[], $20::int[]) AS k(id, room, used, turn)
        ON k.id = r.kind || chr(31) || r.lk
    LEFT JOIN unnest($16::text[], $17::int[], $18::int[]) AS kr(kind, room, key_room) ON kr.kind = r.kind
), needs AS (
    -- Resources are summed in round-robin order, as store.LimitView.Pick
    -- does: in claim order one key's older tasks took every gpu before
    -- another key's turn came.
    SELECT r.id, x.name,
           sum(x.amount::bigint) OVER (PARTITION BY x.name ORDER BY r.rr, r.key_used, r.pos) AS used
    FROM turned r CROSS JOIN LATERAL jsonb_each_text(r.resources) AS x(name, amount)
    WHERE r.resources IS NOT NULL
), unfit AS (
    SELECT n.id FROM needs n
    LEFT JOIN unnest($11::text[], $12::bigint[]) AS f(name, free) ON f.name = n.name
    WHERE n.used > coalesce(f.free, 0)
), picked AS (
    (SELECT c.id, c.old_status, c.bucket
     FROM cand c
     WHERE $21::bool AND (SELECT count(*) FROM sure) >= $4 AND c.id IN (SELECT id FROM sure)
     ORDER BY c.priority DESC, c.run_at, c.id
     LIMIT $4)
    UNION ALL
    (SELECT r.id, r.old_status, r.bucket
    FROM turned r
    WHERE r.id NOT IN (SELECT id FROM unfit)
      AND (r.key_room < 0 OR r.key_rank < r.key_room)
      AND (r.kind_room < 0 OR r.kind_rank < r.kind_room)
      AND NOT ($21::bool AND (SELECT count(*) FROM sure) >= $4)
    ORDER BY r.rr, r.key_used, r.pos
    LIMIT $4)
), claimed AS (
    UPDATE flotilla_tasks t SET
        status = 'running',
        status_version = t.status_version + 1,
        claim_seq = t.claim_seq + 1,
        attempt = t.attempt + 1,
        owner = $2::text,
        node = $5::text,
        epoch = ($7::bigint[])[p.bucket + 1],
        started_at = statement_timestamp(),
        lease_expires_at = statement_timestamp() + $6::bigint * interval '1 microsecond',
        wait_reason = '',
        updated_at = statement_timestamp()
    FROM picked p
    WHERE t.id = p.id
    RETURNING ` + taskColumnsOf("t") + `, t.limit_key, t.resources, t.wait_reason, p.old_status
), ev AS (
    ` + eventInsertSQL(`(SELECT id, status_version, old_status, status, node AS ev_node, epoch, attempt,
                              'claimed' AS reason, '' AS err FROM claimed) c`) + `
)
SELECT ` + taskColumns + `, ` + limitColumns + ` FROM claimed`

// claimLimitedSettingSQL is claimSettingSQL without enable_sort off: the
// limited claim ranks and orders its candidates, and with sorts priced out
// the planner walks its candidates in plans that took two seconds on 1,200
// queued tasks instead of ten milliseconds, past the claim's statement
// timeout. It also sets the claim's plan mode (see limitedPlanMode), and
// sequential scans with it, which after an advance in the same transaction
// would otherwise be the advance's (advanceSettingSQL): off for a generic
// plan, which a connection makes once, perhaps on a table of a page never
// analyzed where a scan of the table is the cheaper plan, and keeps as the
// table grows; on for a custom plan, made for each claim on the table as
// it is.
const claimLimitedSettingSQL = `SELECT set_config('statement_timeout', $1::text, true), set_config('plan_cache_mode', $2::text, true),
       set_config('enable_seqscan', CASE WHEN $2::text = 'force_generic_plan' THEN 'off' ELSE 'on' END, true)`

// Bounds of a limited claim planned once and for all (its generic plan):
// one that asks for at most genericClaimTasks tasks and names at most
// genericClaimKeys limit keys.
//
// Planning the limited claim afresh costs more than running it when it is
// small: 1.4 ms of planning against 0.8 ms of execution, the median of a
// slot's claim under a fleet-wide limit of 8 (50 ms tasks). The generic
// plan joins the keys named by nested loops, which is cheap for a few keys
// and cost four times the custom plan's time with the thousand keys of a
// backlog over many keys, so larger claims keep their custom plans.
// TestLimitedClaimPlans holds the generic plan to the claim index.
const (
	genericClaimTasks = 32
	genericClaimKeys  = 64
)

// limitedPlanMode is the plan_cache_mode a limited claim runs under.
func limitedPlanMode(req store.ClaimRequest, lc store.LimitedClaim) string {
	if req.Limit <= genericClaimTasks && len(lc.Keys) <= genericClaimKeys {
		return "force_generic_plan"
	}
	return "force_custom_plan"
}

// limitPair is how claimLimitedSQL names a (kind, limit key).
func limitPair(kind, key string) string { return kind + "\x1f" + key }

// ClaimLimited claims as ClaimTasks does, within the rooms lc names.
func (s *Store) ClaimLimited(ctx context.Context, req store.ClaimRequest, lc store.LimitedClaim) ([]*task.Task, error) {
	q, err := limitedClaimOf(ctx, req, lc)
	if err != nil || q == nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	q.queue(b)
	b.Queue("COMMIT")
	return s.sendClaim(ctx, b, scanLimitedTasks)
}

// limitedClaim is a limited claim's two statements, ready to queue: its
// statement timeout, then claimLimitedSQL.
type limitedClaim struct {
	timeoutMillis int64
	planMode      string
	args          []any
}

// queue adds the claim's two statements to b, inside a transaction.
func (q *limitedClaim) queue(b *pgx.Batch) {
	b.Queue(claimLimitedSettingSQL, strconv.FormatInt(q.timeoutMillis, 10), q.planMode)
	b.Queue(claimLimitedSQL, q.args...)
}

// limitedClaimOf checks req and turns it and lc into claimLimitedSQL's
// arguments; nil when there is nothing to claim.
func limitedClaimOf(ctx context.Context, req store.ClaimRequest, lc store.LimitedClaim) (*limitedClaim, error) {
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
	closedKinds := []string{}
	kinds, kindRooms, kindKeyRooms := []string{}, []int32{}, []int32{}
	for _, kr := range lc.Kinds {
		if kr.Room == 0 {
			closedKinds = append(closedKinds, kr.Kind)
		}
		kinds = append(kinds, kr.Kind)
		kindRooms = append(kindRooms, int32(kr.Room))
		kindKeyRooms = append(kindKeyRooms, int32(kr.KeyRoom))
	}
	closedKeys, busyKeys := []string{}, []string{}
	keyIDs, keyRooms, keyUsed, keyTurns := []string{}, []int32{}, []int32{}, []int32{}
	for _, k := range lc.Keys {
		id := limitPair(k.Kind, k.Key)
		if lc.Busy(k.Used) {
			busyKeys = append(busyKeys, id)
		}
		if k.Room == 0 {
			closedKeys = append(closedKeys, id)
			continue
		}
		keyIDs = append(keyIDs, id)
		keyRooms = append(keyRooms, int32(k.Room))
		keyUsed = append(keyUsed, int32(k.Used))
		keyTurns = append(keyTurns, int32(k.Turn))
	}
	names, frees := []string{}, []int64{}
	for name, v := range lc.Free {
		names = append(names, name)
		frees = append(frees, v)
	}
	capNames, capAmounts := []string{}, []int64{}
	for name, v := range lc.Capacity {
		capNames = append(capNames, name)
		capAmounts = append(capAmounts, v)
	}
	q := &limitedClaim{planMode: limitedPlanMode(req, lc), timeoutMillis: statementMillis(ctx)}
	q.args = []any{h.buckets, req.Owner, req.Kinds, req.Limit, req.Node, micros(req.LeaseTTL),
		h.epochByBucket, closedKinds, closedKeys, lc.ScanOf(req.Limit), names, frees,
		keyIDs, keyRooms, keyUsed, kinds, kindRooms, kindKeyRooms, busyKeys, keyTurns, sureDecides(lc),
		capNames, capAmounts, lc.Capacity != nil}
	return q, nil
}

// activeUseSQL reads the active rows of the buckets through the active
// index.
var activeUseSQL = `
SELECT t.id, t.kind, ` + limitKeySQL + `, t.resources, t.bucket, coalesce(t.owner, ''), t.epoch, t.claim_seq
FROM flotilla_tasks t
WHERE t.status IN ` + activeStatusesSQL + ` AND t.bucket = ANY($1::int[])
ORDER BY t.id`

// listKeyUseSQL counts the active tasks through the active index.
var listKeyUseSQL = `
SELECT t.kind, coalesce(t.node, ''), ` + limitKeySQL + ` AS lk, count(*)
FROM flotilla_tasks t
WHERE t.status IN ` + activeStatusesSQL + `
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3`

// ListKeyUse counts the active tasks by kind, node and limit key.
func (s *Store) ListKeyUse(ctx context.Context) ([]store.KeyUse, error) {
	rows, err := s.pool.Query(ctx, listKeyUseSQL)
	if err != nil {
		return nil, wrap(err, "count active tasks by limit key")
	}
	defer rows.Close()
	out := []store.KeyUse{}
	for rows.Next() {
		var u store.KeyUse
		var n int64
		if err := rows.Scan(&u.Kind, &u.Node, &u.LimitKey, &n); err != nil {
			return nil, wrap(err, "count active tasks by limit key")
		}
		u.Active = int(n)
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "count active tasks by limit key")
	}
	// The database's collation may order text otherwise than Go.
	slices.SortFunc(out, store.CompareKeyUse)
	return out, nil
}

// ActiveUse lists the active tasks of the buckets.
func (s *Store) ActiveUse(ctx context.Context, buckets []int) ([]store.ActiveUse, error) {
	bs := make([]int32, len(buckets))
	for i, b := range buckets {
		bs[i] = int32(b)
	}
	rows, err := s.pool.Query(ctx, activeUseSQL, bs)
	if err != nil {
		return nil, wrap(err, "read active tasks")
	}
	defer rows.Close()
	out := []store.ActiveUse{}
	for rows.Next() {
		var u store.ActiveUse
		var res []byte
		var b int32
		if err := rows.Scan(&u.ID, &u.Kind, &u.LimitKey, &res, &b, &u.Owner, &u.Epoch, &u.ClaimSeq); err != nil {
			return nil, wrap(err, "read active tasks")
		}
		u.Bucket = int(b)
		if res != nil {
			if err := json.Unmarshal(res, &u.Resources); err != nil {
				return nil, fmt.Errorf("read active tasks: task %d: resources %s: %w", u.ID, res, err)
			}
		}
		out = append(out, u)
	}
	return out, wrap(rows.Err(), "read active tasks")
}

// takeShareLockSQL locks the limit's row (FOR UPDATE), which every
// TakeShare of the limit takes first, so that two holders never both count
// the same idle quota.
const takeShareLockSQL = `
SELECT kind, per, concurrency FROM flotilla_limits WHERE name = $1 FOR UPDATE`

// takeShareReadSQL returns, under that lock, the owner's queued demand
// (capped at the limit; only tasks that need no more of a resource than the
// owner has in all, $4 and $5, count), and for every other holder its owner and demand
// when its share is live and what it counts for: the larger of its live share and
// the tasks of the kind it runs. It reads the limit's kind and
// concurrency itself, so that it goes in the same round trip as the lock.
// Go decides the grant (store.FairShare, store.GrantShare) and writes it
// in the same transaction.
var takeShareReadSQL = `
WITH lim AS (
    SELECT kind, concurrency FROM flotilla_limits WHERE name = $1
), running AS (
    SELECT t.owner, count(*)::int AS n
    FROM flotilla_tasks t
    WHERE t.status IN ` + activeStatusesSQL + ` AND t.kind = (SELECT kind FROM lim) AND t.owner IS NOT NULL
      AND t.owner <> $2
    GROUP BY t.owner
), shares AS (
    SELECT owner, share, demand FROM flotilla_limit_shares
    WHERE limit_name = $1 AND owner <> $2 AND expires_at > statement_timestamp()
)
SELECT
    (SELECT count(*)::int FROM (
        SELECT 1 FROM flotilla_tasks t
        WHERE t.status IN ` + claimableStatusesSQL + ` AND t.run_at <= statement_timestamp()
          AND t.kind = (SELECT kind FROM lim) AND t.bucket = ANY($3::int[])
          AND NOT (t.resources IS NOT NULL AND EXISTS (
              SELECT 1 FROM jsonb_each_text(t.resources) AS y(name, amount)
              LEFT JOIN unnest($4::text[], $5::bigint[]) AS cap(name, amount) ON cap.name = y.name
              WHERE y.amount::bigint > coalesce(cap.amount, 0)))
        LIMIT (SELECT concurrency FROM lim)) q),
    coalesce((SELECT array_agg(owner ORDER BY owner) FROM shares), '{}'),
    coalesce((SELECT array_agg(demand ORDER BY owner) FROM shares), '{}'),
    coalesce((SELECT sum(greatest(coalesce(s.share, 0), coalesce(r.n, 0)))::int
              FROM shares s FULL JOIN running r ON r.owner = s.owner), 0)`

const writeShareSQL = `
INSERT INTO flotilla_limit_shares (limit_name, owner, node, share, demand, expires_at)
VALUES ($1, $2, $3, $4, $5, statement_timestamp() + $6::bigint * interval '1 microsecond')
ON CONFLICT (limit_name, owner) DO UPDATE SET
    node = EXCLUDED.node, share = EXCLUDED.share, demand = EXCLUDED.demand, expires_at = EXCLUDED.expires_at
RETURNING expires_at`

// TakeShare renews the owner's share of a fleet-wide limit in two round
// trips (Store.batchedTx): BEGIN, the lock and the read in one batch, then
// the write and COMMIT in another, Go deciding the grant in between. A
// holder takes its share every 100 ms while it uses the limit, and its
// claims wait while it does: each round trip saved is time its slots do
// not wait.
func (s *Store) TakeShare(ctx context.Context, req store.ShareRequest) (store.Share, error) {
	if req.Owner == "" || req.TTL <= 0 {
		return store.Share{}, fmt.Errorf("take share: an owner and a positive TTL are needed (got %q, %v): %w", req.Owner, req.TTL, store.ErrInvalid)
	}
	var out store.Share
	err := s.batchedTx(ctx, func(conn *pgx.Conn) error {
		var err error
		out, err = takeShare(ctx, conn, req)
		return err
	})
	if err != nil {
		return store.Share{}, wrap(err, "take share of limit %s", store.Shorten(req.Limit, 60))
	}
	return out, nil
}

// takeShare is TakeShare's transaction on conn. A limit that is gone or
// not fleet-wide leaves the transaction open with nothing written, for
// batchedTx to roll back.
func takeShare(ctx context.Context, conn *pgx.Conn, req store.ShareRequest) (store.Share, error) {
	out := store.Share{Limit: req.Limit}
	bs := make([]int32, len(req.Buckets))
	for i, b := range req.Buckets {
		bs[i] = int32(b)
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(takeShareLockSQL, req.Limit)
	capNames, capAmounts := []string{}, []int64{}
	for name, v := range req.Capacity {
		capNames = append(capNames, name)
		capAmounts = append(capAmounts, v)
	}
	b.Queue(takeShareReadSQL, req.Limit, req.Owner, bs, capNames, capAmounts)
	br := conn.SendBatch(ctx, b)
	var per string
	var n, queued, others int32
	var owners []string
	var demands []int32
	_, err := br.Exec()
	found := true
	if err == nil {
		err = br.QueryRow().Scan(&out.Kind, &per, &n)
		if err == pgx.ErrNoRows {
			found, err = false, nil
		}
	}
	if err == nil {
		err = br.QueryRow().Scan(&queued, &owners, &demands, &others)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return out, err
	}
	if !found || per != store.PerFleet || n == 0 {
		return store.Share{Limit: req.Limit}, nil
	}
	out.N, out.Found = int(n), true
	out.Demand = min(req.Running+int(queued), out.N, max(req.MaxDemand, req.Running))
	if len(owners) != len(demands) {
		return out, fmt.Errorf("read the shares: %d owners and %d demands", len(owners), len(demands))
	}
	all := map[string]int{req.Owner: out.Demand}
	for i, d := range demands {
		all[owners[i]] = int(d)
	}
	out.Share = store.GrantShare(out.N, store.FairShare(out.N, all, req.Owner), int(others))
	b = &pgx.Batch{}
	b.Queue(writeShareSQL, req.Limit, req.Owner, req.Node, int32(out.Share), int32(out.Demand), micros(req.TTL))
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	err = br.QueryRow().Scan(&out.ExpiresAt)
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return store.Share{}, err
	}
	out.ExpiresAt = out.ExpiresAt.UTC()
	return out, nil
}

// ListShares returns every share row.
func (s *Store) ListShares(ctx context.Context) ([]store.ShareUse, error) {
	rows, err := s.pool.Query(ctx, `
SELECT limit_name, owner, node, share, demand, expires_at, expires_at > statement_timestamp()
FROM flotilla_limit_shares ORDER BY limit_name, node, owner`)
	if err != nil {
		return nil, wrap(err, "list limit shares")
	}
	defer rows.Close()
	out := []store.ShareUse{}
	for rows.Next() {
		var u store.ShareUse
		var share, demand int32
		if err := rows.Scan(&u.Limit, &u.Owner, &u.Node, &share, &demand, &u.ExpiresAt, &u.Alive); err != nil {
			return nil, wrap(err, "list limit shares")
		}
		u.Share, u.Demand, u.ExpiresAt = int(share), int(demand), u.ExpiresAt.UTC()
		out = append(out, u)
	}
	return out, wrap(rows.Err(), "list limit shares")
}

// reasonsHeldSQL is the buckets $1 holds under the epochs named ($2, $3),
// where both statements below write reasons.
const reasonsHeldSQL = `WITH held AS (
    SELECT l.bucket
    FROM flotilla_bucket_leases l
    JOIN unnest($2::int[], $3::bigint[]) AS h(bucket, epoch) ON h.bucket = l.bucket AND h.epoch = l.epoch
    WHERE l.owner = $1::text AND l.expires_at > statement_timestamp()
)`

// setKeyWaitReasonsSQL writes reasons that each name one limit key ($4,
// $5, $6: kind, key, reason; one per key) on the waiting rows of those
// keys in the buckets $1 holds under the epochs named, skipping rows that
// carry the reason already, at most $7 rows. The keys' reasons go alone
// at most refreshes, over a backlog that may be large: the join to the
// keys keeps the rows it reads to theirs.
var setKeyWaitReasonsSQL = `
` + reasonsHeldSQL + `, r AS (
    SELECT * FROM unnest($4::text[], $5::text[], $6::text[]) AS r(kind, lk, reason)
), todo AS (
    SELECT t.id, r.reason
    FROM flotilla_tasks t
    JOIN r ON r.kind = t.kind AND r.lk = ` + limitKeySQL + `
    WHERE t.status IN ` + claimableStatusesSQL + ` AND t.run_at <= statement_timestamp()
      AND t.bucket = ANY(ARRAY(SELECT bucket FROM held))
      AND t.wait_reason <> r.reason
    ORDER BY t.id
    LIMIT $7
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE flotilla_tasks t SET wait_reason = todo.reason FROM todo WHERE t.id = todo.id`

// setWaitReasonsSQL writes reasons on the waiting rows they name in the
// buckets $1 holds under the epochs named, each row the reason
// store.WaitReasonFor picks, skipping rows that carry their reason
// already, at most $10 rows. The rows to write are found first, on their
// own (named): with the limit and the order by id beside them, the planner
// walked the backlog by id and joined each row to the reasons in a nested
// loop, 1.3 s for 100,000 rows that carried their reasons already.
//
// When every reason is one for tasks that need more than is free, the
// rows needing nothing cannot match, and waitingRows narrows the read to
// the others: flotilla_tasks_resources_waiting_idx holds only those, so a
// node that declares no capacity reads them, not its whole backlog, each
// time it says why they wait.
var setWaitReasonsSQL = waitReasonsSQL("")

// setResourceWaitReasonsSQL is setWaitReasonsSQL for reasons that are all
// by resources.
var setResourceWaitReasonsSQL = waitReasonsSQL(" AND t.resources IS NOT NULL")

func waitReasonsSQL(waitingRows string) string {
	return `
` + reasonsHeldSQL + `, r AS (
    SELECT * FROM unnest($4::text[], $5::text[], $6::bool[], $7::bool[], $8::jsonb[], $9::text[])
        WITH ORDINALITY AS r(kind, lk, all_keys, by_res, free, reason, ord)
), by_key AS (
    SELECT DISTINCT ON (kind, lk) kind, lk, reason FROM r WHERE NOT all_keys ORDER BY kind, lk, ord
), by_resources AS (
    SELECT DISTINCT ON (kind) kind, free, reason FROM r WHERE all_keys AND by_res ORDER BY kind, ord
), by_kind AS (
    SELECT DISTINCT ON (kind) kind, reason FROM r WHERE all_keys AND NOT by_res ORDER BY kind, ord
), named AS MATERIALIZED (
    SELECT t.id, x.reason
    FROM flotilla_tasks t
    LEFT JOIN by_key k ON k.kind = t.kind AND k.lk = ` + limitKeySQL + `
    LEFT JOIN by_resources rs ON rs.kind = t.kind
    LEFT JOIN by_kind w ON w.kind = t.kind
    CROSS JOIN LATERAL (SELECT coalesce(k.reason,
        CASE WHEN rs.reason IS NOT NULL AND EXISTS (
            SELECT 1 FROM jsonb_each_text(t.resources) e
            WHERE e.value::bigint > coalesce((rs.free ->> e.key)::bigint, 0)) THEN rs.reason END,
        w.reason) AS reason) x
    WHERE t.status IN ` + claimableStatusesSQL + ` AND t.run_at <= statement_timestamp()
      AND t.bucket = ANY(ARRAY(SELECT bucket FROM held))
      AND t.wait_reason <> x.reason` + waitingRows + `
), todo AS (
    SELECT t.id, n.reason
    FROM (SELECT id, reason FROM named ORDER BY id LIMIT $10) n
    JOIN flotilla_tasks t ON t.id = n.id
    WHERE t.status IN ` + claimableStatusesSQL + ` AND t.wait_reason <> n.reason
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE flotilla_tasks t SET wait_reason = todo.reason FROM todo WHERE t.id = todo.id`
}

// SetWaitReasons writes reasons on the waiting tasks they name.
func (s *Store) SetWaitReasons(ctx context.Context, owner string, buckets []store.HeldBucket, reasons []store.WaitReason) (int, error) {
	if len(reasons) == 0 || len(buckets) == 0 {
		return 0, nil
	}
	bs, eps := make([]int32, len(buckets)), make([]int64, len(buckets))
	for i, h := range buckets {
		bs[i], eps[i] = int32(h.Bucket), h.Epoch
	}
	var kinds, keys, texts, free []string
	var allKeys, byRes []bool
	wide, byResources := false, true
	seen := map[[2]string]bool{}
	for _, r := range reasons {
		if k := [2]string{r.Kind, r.LimitKey}; !r.AllKeys {
			// Of one key's reasons the first given; the join below would
			// write any of them.
			if seen[k] {
				continue
			}
			seen[k] = true
		}
		wide = wide || r.AllKeys
		byResources = byResources && r.AllKeys && r.ByResources
		f := r.Free
		if f == nil {
			f = store.Resources{}
		}
		js, _ := json.Marshal(f)
		kinds, keys, texts = append(kinds, r.Kind), append(keys, r.LimitKey), append(texts, r.Reason)
		allKeys, byRes, free = append(allKeys, r.AllKeys), append(byRes, r.AllKeys && r.ByResources), append(free, string(js))
	}
	var args []any
	sql := setKeyWaitReasonsSQL
	if wide {
		sql = setWaitReasonsSQL
		if byResources {
			sql = setResourceWaitReasonsSQL
		}
		args = []any{owner, bs, eps, kinds, keys, allKeys, byRes, free, texts, store.MaxWaitReasonRows}
	} else {
		args = []any{owner, bs, eps, kinds, keys, texts, store.MaxWaitReasonRows}
	}
	if sql == setResourceWaitReasonsSQL {
		waiting, err := s.needResourcesIn(ctx, bs)
		if err != nil || !waiting {
			return 0, err
		}
	}
	tag, err := s.pool.Exec(ctx, sql, args...)
	if err != nil {
		return 0, wrap(err, "write wait reasons")
	}
	return int(tag.RowsAffected()), nil
}

// needResourcesSQL says whether a waiting task of the buckets $1 needs
// resources: a probe of the index that holds only those.
var needResourcesSQL = `SELECT EXISTS (
    SELECT 1 FROM flotilla_tasks t
    WHERE t.bucket = ANY($1::int[]) AND t.resources IS NOT NULL AND t.status IN ` + claimableStatusesSQL + `)`

// needResourcesSettingSQL has needResourcesSQL run on its generic plan,
// made without sequential or bitmap scans: a walk of the index of the
// waiting tasks that need resources by bucket, whatever the table held
// when a connection made it. Made on a table of a page, never analyzed, it
// was a scan of the table with sequential scans on, and with them off a
// bitmap scan of the claim index (the bucket is its last column), which
// reads every claimable row: TestTheProbeForTasksThatNeedResourcesReadsTheirIndex
// fails either way.
const needResourcesSettingSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// needResourcesIn reports whether a waiting task of buckets needs
// resources. Every node that declares no capacity writes why such tasks
// wait at each heartbeat, mostly when there is none: planning that write
// cost 1.5 ms against 0.1 ms of running it, the largest part of what an
// idle fleet of 64 nodes cost the database. The probe, on its generic
// plan, lets the write be sent only when it has something to write.
func (s *Store) needResourcesIn(ctx context.Context, buckets []int32) (bool, error) {
	var waiting bool
	err := s.readOnItsPlan(ctx, needResourcesSettingSQL, needResourcesSQL, []any{buckets}, func(rows pgx.Rows) error {
		for rows.Next() {
			if err := rows.Scan(&waiting); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	return waiting, wrap(err, "look for tasks that need resources")
}

// sureDecides reports whether claimLimitedSQL's sure candidates, when they
// fill the claim, are all it may take: with no resources free, no kind
// with a room of its own and no key named with its turn now and nothing
// running (a key a rate limit names), every candidate as early in the
// round robin as a sure one is sure, so the first of them in claim order
// are what the ranking would pick.
func sureDecides(lc store.LimitedClaim) bool {
	if len(lc.Free) > 0 {
		return false
	}
	for _, kr := range lc.Kinds {
		if kr.Room >= 0 {
			return false
		}
	}
	for _, k := range lc.Keys {
		if k.Turn == 0 && k.Used == 0 {
			return false
		}
	}
	return true
}
