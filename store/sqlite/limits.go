package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// The limits follow the memory store's rules, written in Go over rows read
// under the write lock (see the package documentation): the limited claim
// decides with store.LimitView over the candidates it reads, and a share
// is decided in the writer's transaction, which one write lock serialises
// with every other TakeShare of the file.

const limitColumns = `name, kind, per, concurrency, rate, period_ms, burst, created_at, updated_at`

func scanLimit(row scanner) (store.Limit, error) {
	var (
		l                store.Limit
		periodMS         int64
		created, updated sql.NullInt64
	)
	if err := row.Scan(&l.Name, &l.Kind, &l.Per, &l.Concurrency, &l.Rate, &periodMS, &l.Burst, &created, &updated); err != nil {
		return store.Limit{}, err
	}
	l.Period = time.Duration(periodMS) * time.Millisecond
	l.CreatedAt, l.UpdatedAt = fromMicros(created), fromMicros(updated)
	return l, nil
}

// UpsertLimit creates or replaces a limit, keeping its creation time.
func (s *Store) UpsertLimit(ctx context.Context, l store.Limit) (store.Limit, error) {
	if err := store.CheckLimit(l); err != nil {
		return store.Limit{}, fmt.Errorf("limit %s: %w", store.Shorten(l.Name, 60), err)
	}
	var out store.Limit
	err := s.write(ctx, func(tx *wtx) error {
		var err error
		out, err = scanLimit(tx.queryRow(`INSERT INTO flotilla_limits (`+limitColumns+`)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, per = excluded.per, concurrency = excluded.concurrency,
    rate = excluded.rate, period_ms = excluded.period_ms, burst = excluded.burst, updated_at = excluded.updated_at
RETURNING `+limitColumns, l.Name, l.Kind, l.Per, l.Concurrency, l.Rate, l.Period.Milliseconds(), l.Burst,
			tx.now.UnixMicro(), tx.now.UnixMicro()))
		return wrapIf(err, "save limit "+store.Shorten(l.Name, 60))
	})
	if err != nil {
		return store.Limit{}, requireSchema(err)
	}
	return out, nil
}

// ListLimits returns every limit by name.
func (s *Store) ListLimits(ctx context.Context) ([]store.Limit, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+limitColumns+` FROM flotilla_limits ORDER BY name`)
	if err != nil {
		return nil, requireSchema(wrap(err, "list limits"))
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
	return out, wrapIf(rows.Err(), "list limits")
}

// DeleteLimit removes a limit and its shares.
func (s *Store) DeleteLimit(ctx context.Context, name string) error {
	err := s.write(ctx, func(tx *wtx) error {
		res, err := tx.exec(`DELETE FROM flotilla_limits WHERE name = ?`, name)
		if err != nil {
			return wrap(err, "delete limit %s", store.Shorten(name, 60))
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if err != nil {
				return wrap(err, "delete limit %s", store.Shorten(name, 60))
			}
			return fmt.Errorf("limit %s: %w", store.Shorten(name, 60), store.ErrNotFound)
		}
		_, err = tx.exec(`DELETE FROM flotilla_limit_shares WHERE limit_name = ?`, name)
		return wrapIf(err, "delete the shares of limit "+store.Shorten(name, 60))
	})
	return requireSchema(err)
}

// limitedWalkSQL reads, in the claim's order and through
// flotilla_tasks_claim_idx as claimSQL does, the first due tasks (the last
// parameter) of the held buckets and open kinds whose key is not left out
// (kind || char(31) || limit key in the fourth parameter), and of the kinds
// whose keys not named are shut (the fifth), only the open named keys (the
// sixth). The keys are left out in SQL, not after reading each row: one
// key's backlog of thousands of rows is passed over in the index walk.
const limitedWalkSQL = `SELECT ` + taskColumns + ` FROM flotilla_tasks
WHERE status IN ('queued', 'scheduled', 'retrying')
  AND (status = 'queued' OR run_at <= ?)
  AND bucket IN (SELECT value FROM json_each(?))
  AND kind IN (SELECT value FROM json_each(?))
  AND kind || char(31) || (CASE WHEN limit_key = '' THEN key ELSE limit_key END) NOT IN (SELECT value FROM json_each(?))
  AND (kind NOT IN (SELECT value FROM json_each(?))
       OR kind || char(31) || (CASE WHEN limit_key = '' THEN key ELSE limit_key END) IN (SELECT value FROM json_each(?)))
ORDER BY priority DESC, run_at, id
LIMIT ?`

// claimLimitedUpdateSQL is claimUpdateSQL clearing the wait reason: a
// started task no longer waits.
const claimLimitedUpdateSQL = `UPDATE flotilla_tasks
SET status = 'running', status_version = status_version + 1, attempt = attempt + 1, claim_seq = claim_seq + 1,
    owner = ?, node = ?, epoch = json_extract(?, '$."' || bucket || '"'), lease_expires_at = ?,
    started_at = ?, updated_at = ?, wait_reason = ''
WHERE id IN (SELECT value FROM json_each(?))`

// ClaimLimited claims as ClaimTasks does, within the rooms lc names. The
// candidates are the first Scan due tasks in claim order that no closed
// kind or key rules out, and the first Scan of those after them whose key
// is neither busy nor among the first ones': one walk in claim order
// collects both and stops when both are full. With every key busy the walk
// reads the held buckets' whole queue, as the memory store does.
func (s *Store) ClaimLimited(ctx context.Context, req store.ClaimRequest, lc store.LimitedClaim) ([]*task.Task, error) {
	if req.Owner == "" {
		return nil, fmt.Errorf("%w: a claim needs the owner's incarnation", store.ErrInvalid)
	}
	if req.LeaseTTL <= 0 {
		return nil, fmt.Errorf("%w: task lease TTL %v is not positive", store.ErrInvalid, req.LeaseTTL)
	}
	claimed := []*task.Task{}
	view := lc.View()
	kinds := make([]string, 0, len(req.Kinds))
	for _, k := range req.Kinds {
		if !view.KindClosed(k) {
			kinds = append(kinds, k)
		}
	}
	if req.Limit <= 0 || len(kinds) == 0 || len(req.Buckets) == 0 {
		return claimed, s.checkOpen()
	}
	err := s.write(ctx, func(tx *wtx) error {
		epochs, live, err := liveEpochs(tx, req)
		if err != nil || len(live) == 0 {
			return err
		}
		cands, err := limitedCandidates(tx, view, lc.ScanOf(req.Limit), live, kinds)
		if err != nil {
			return err
		}
		picks := view.Pick(cands, req.Limit)
		picked := make([]*task.Task, len(picks))
		for i, p := range picks {
			picked[i] = cands[p]
			picked[i].WaitReason = ""
		}
		if err := startPicked(tx, req, epochs, picked, claimLimitedUpdateSQL); err != nil {
			return err
		}
		claimed = append(claimed[:0], picked...)
		return nil
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return claimed, nil
}

// limitedCandidates returns, in claim order, the first scan due tasks
// that are not closed together with the first scan of those whose key is
// neither busy nor among the first ones' (store.LimitView.SecondWalk): two
// walks of the claim index, each stopping at scan rows.
func limitedCandidates(tx *wtx, view *store.LimitView, scan int, live []int, kinds []string) ([]*task.Task, error) {
	closed, busy, open, shut := view.Named()
	walk := func(out []string) ([]*task.Task, error) {
		rows, err := tx.query(limitedWalkSQL, tx.now.UnixMicro(), intsJSON(live), stringsJSON(kinds), stringsJSON(out),
			stringsJSON(shut), stringsJSON(open), scan)
		if err != nil {
			return nil, wrap(err, "limited claim")
		}
		defer rows.Close()
		var ts []*task.Task
		for rows.Next() {
			t, err := scanTask(rows)
			if err != nil {
				return nil, wrap(err, "limited claim")
			}
			if !view.Closed(t) {
				ts = append(ts, t)
			}
		}
		return ts, wrapIf(rows.Err(), "limited claim")
	}
	first, err := walk(closed)
	if err != nil || len(first) < scan {
		// The first walk read every candidate: there is nothing behind it.
		return first, err
	}
	out := append(slices.Clone(closed), busy...)
	for _, t := range first {
		out = append(out, t.Kind+"\x1f"+store.LimitKeyOf(t.Key, t.LimitKey))
	}
	second, err := walk(out)
	if err != nil {
		return nil, err
	}
	all := append(first, second...)
	slices.SortFunc(all, func(a, b *task.Task) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.RunAt.Compare(b.RunAt), cmp.Compare(a.ID, b.ID))
	})
	return all, nil
}

// ListKeyUse counts the active tasks by kind, node and limit key.
func (s *Store) ListKeyUse(ctx context.Context) ([]store.KeyUse, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT kind, coalesce(node, ''), CASE WHEN limit_key = '' THEN key ELSE limit_key END, count(*)
FROM flotilla_tasks
WHERE status IN ('running', 'stopping', 'pausing')
GROUP BY 1, 2, 3`)
	if err != nil {
		return nil, requireSchema(wrap(err, "count active tasks by limit key"))
	}
	defer rows.Close()
	out := []store.KeyUse{}
	for rows.Next() {
		var u store.KeyUse
		if err := rows.Scan(&u.Kind, &u.Node, &u.LimitKey, &u.Active); err != nil {
			return nil, wrap(err, "count active tasks by limit key")
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "count active tasks by limit key")
	}
	slices.SortFunc(out, store.CompareKeyUse)
	return out, nil
}

// ActiveUse lists the active tasks of the buckets, by id.
func (s *Store) ActiveUse(ctx context.Context, buckets []int) ([]store.ActiveUse, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	out := []store.ActiveUse{}
	if len(buckets) == 0 {
		return out, nil
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, kind, key, limit_key, resources, bucket, owner, epoch, claim_seq
FROM flotilla_tasks
WHERE status IN ('running', 'stopping', 'pausing') AND bucket IN (SELECT value FROM json_each(?))
ORDER BY id`, intsJSON(buckets))
	if err != nil {
		return nil, requireSchema(wrap(err, "active use"))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			u          store.ActiveUse
			key, lk    string
			res, owner sql.NullString
		)
		if err := rows.Scan(&u.ID, &u.Kind, &key, &lk, &res, &u.Bucket, &owner, &u.Epoch, &u.ClaimSeq); err != nil {
			return nil, wrap(err, "active use")
		}
		if u.Resources, err = resourcesOf(res); err != nil {
			return nil, fmt.Errorf("active use: task %d: %w", u.ID, err)
		}
		u.LimitKey, u.Owner = store.LimitKeyOf(key, lk), owner.String
		out = append(out, u)
	}
	return out, wrapIf(rows.Err(), "active use")
}

// TakeShare renews the owner's share of a fleet-wide limit in the writer's
// transaction: the file's write lock stands for the lock on the limit's
// row that every TakeShare takes on PostgreSQL.
func (s *Store) TakeShare(ctx context.Context, req store.ShareRequest) (store.Share, error) {
	if req.Owner == "" || req.TTL <= 0 {
		return store.Share{}, fmt.Errorf("%w: a share needs an owner and a positive TTL (got %q, %v)", store.ErrInvalid, req.Owner, req.TTL)
	}
	var out store.Share
	err := s.write(ctx, func(tx *wtx) error {
		out = store.Share{Limit: req.Limit}
		l, err := scanLimit(tx.queryRow(`SELECT `+limitColumns+` FROM flotilla_limits WHERE name = ?`, req.Limit))
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return wrap(err, "read limit %s", store.Shorten(req.Limit, 60))
		}
		if l.Per != store.PerFleet || l.Concurrency == 0 {
			return nil
		}
		g, err := readShareInputs(tx, l, req)
		if err != nil {
			return err
		}
		demand := min(req.Running+g.queued, l.Concurrency, max(req.MaxDemand, req.Running))
		g.demands[req.Owner] = demand
		grant := store.GrantShare(l.Concurrency, store.FairShare(l.Concurrency, g.demands, req.Owner), g.others)
		expires := dbTime(tx.now.Add(req.TTL))
		if _, err := tx.exec(`INSERT INTO flotilla_limit_shares (limit_name, owner, node, share, demand, expires_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (limit_name, owner) DO UPDATE SET node = excluded.node, share = excluded.share,
    demand = excluded.demand, expires_at = excluded.expires_at`,
			l.Name, req.Owner, req.Node, grant, demand, expires.UnixMicro()); err != nil {
			return wrap(err, "write the share of limit %s", store.Shorten(l.Name, 60))
		}
		out = store.Share{Limit: l.Name, Kind: l.Kind, N: l.Concurrency, Share: grant, Demand: demand,
			ExpiresAt: expires, Found: true}
		return nil
	})
	if err != nil {
		return store.Share{}, requireSchema(err)
	}
	return out, nil
}

// shareInputs is what a share is decided from: the owner's queued demand,
// the live demands of the others, and what the others hold (each at the
// larger of its live share and the tasks of the kind it runs; a lapsed
// holder, or one without a share row, by its tasks alone).
type shareInputs struct {
	queued  int
	demands map[string]int // by owner
	others  int
}

func readShareInputs(tx *wtx, l store.Limit, req store.ShareRequest) (shareInputs, error) {
	g := shareInputs{demands: map[string]int{}}
	held := req.Buckets
	if held == nil {
		held = []int{}
	}
	capacity, err := json.Marshal(req.Capacity)
	if err != nil || req.Capacity == nil {
		capacity = []byte("{}")
	}
	// A task needing more of a resource than the owner has in all never
	// starts there: it is no demand of the owner's.
	if err := tx.queryRow(`SELECT count(*) FROM flotilla_tasks t
WHERE t.kind = ? AND t.bucket IN (SELECT value FROM json_each(?))
  AND t.status IN ('queued', 'scheduled', 'retrying') AND (t.status = 'queued' OR t.run_at <= ?)
  AND NOT (t.resources IS NOT NULL AND EXISTS (
      SELECT 1 FROM json_each(t.resources) e
      WHERE e.value > coalesce((SELECT c.value FROM json_each(?) c WHERE c.key = e.key), 0)))`,
		l.Kind, intsJSON(held), tx.now.UnixMicro(), string(capacity)).Scan(&g.queued); err != nil {
		return g, wrap(err, "read the demand for limit %s", store.Shorten(l.Name, 60))
	}
	running := map[string]int{}
	rows, err := tx.query(`SELECT coalesce(owner, ''), count(*) FROM flotilla_tasks
WHERE kind = ? AND status IN ('running', 'stopping', 'pausing') AND coalesce(owner, '') <> ?
GROUP BY 1`, l.Kind, req.Owner)
	if err != nil {
		return g, wrap(err, "read the running tasks of kind %s", store.Shorten(l.Kind, 60))
	}
	for rows.Next() {
		var (
			owner string
			n     int
		)
		if err := rows.Scan(&owner, &n); err != nil {
			rows.Close()
			return g, wrap(err, "read the running tasks of kind %s", store.Shorten(l.Kind, 60))
		}
		running[owner] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return g, wrap(err, "read the running tasks of kind %s", store.Shorten(l.Kind, 60))
	}
	rows, err = tx.query(`SELECT owner, share, demand, expires_at FROM flotilla_limit_shares
WHERE limit_name = ? AND owner <> ?`, l.Name, req.Owner)
	if err != nil {
		return g, wrap(err, "read the shares of limit %s", store.Shorten(l.Name, 60))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			owner         string
			share, demand int
			expires       int64
		)
		if err := rows.Scan(&owner, &share, &demand, &expires); err != nil {
			return g, wrap(err, "read the shares of limit %s", store.Shorten(l.Name, 60))
		}
		if tx.now.Before(time.UnixMicro(expires)) {
			g.demands[owner] = demand
			g.others += max(share, running[owner])
		} else {
			g.others += running[owner]
		}
		delete(running, owner)
	}
	if err := rows.Err(); err != nil {
		return g, wrap(err, "read the shares of limit %s", store.Shorten(l.Name, 60))
	}
	for _, n := range running { // owners without a share row
		g.others += n
	}
	return g, nil
}

// ListShares returns every share row.
func (s *Store) ListShares(ctx context.Context) ([]store.ShareUse, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT limit_name, owner, node, share, demand, expires_at,
    expires_at > `+nowSQL+`
FROM flotilla_limit_shares ORDER BY limit_name, node, owner`)
	if err != nil {
		return nil, requireSchema(wrap(err, "list limit shares"))
	}
	defer rows.Close()
	out := []store.ShareUse{}
	for rows.Next() {
		var (
			u       store.ShareUse
			expires sql.NullInt64
		)
		if err := rows.Scan(&u.Limit, &u.Owner, &u.Node, &u.Share, &u.Demand, &expires, &u.Alive); err != nil {
			return nil, wrap(err, "list limit shares")
		}
		u.ExpiresAt = fromMicros(expires)
		out = append(out, u)
	}
	return out, wrapIf(rows.Err(), "list limit shares")
}

// setWaitReasonsSQL writes reasons (a JSON array of [kind, limit key,
// all keys, by resources, free, reason]) on the waiting rows they name in
// the live buckets (a JSON array), each row the reason store.WaitReasonFor
// picks, skipping rows that carry their reason already, at most
// MaxWaitReasonRows rows, by id.
//
// When every reason is one for tasks that need more than is free, the
// rows needing nothing cannot match, and waitingRows narrows the read to
// the others (flotilla_tasks_resources_waiting_idx holds only those): a
// node that declares no capacity reads them, not its whole backlog, inside
// the writer's lock.
var setWaitReasonsSQL = waitReasonsSQL("")

// setResourceWaitReasonsSQL is setWaitReasonsSQL for reasons that are all
// by resources.
var setResourceWaitReasonsSQL = waitReasonsSQL(" AND t.resources IS NOT NULL")

func waitReasonsSQL(waitingRows string) string {
	return `WITH r(ord, kind, lk, all_keys, by_res, free, reason) AS (
    SELECT key, json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
           json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]')
    FROM json_each(?)
), named(id, reason, cur) AS (
    SELECT t.id, coalesce(
        (SELECT r.reason FROM r
         WHERE r.kind = t.kind AND NOT r.all_keys
           AND r.lk = (CASE WHEN t.limit_key = '' THEN t.key ELSE t.limit_key END)
         ORDER BY r.ord LIMIT 1),
        (SELECT r.reason FROM r
         WHERE r.kind = t.kind AND r.all_keys AND r.by_res AND EXISTS (
             SELECT 1 FROM json_each(t.resources) e
             WHERE e.value > coalesce((SELECT f.value FROM json_each(r.free) f WHERE f.key = e.key), 0))
         ORDER BY r.ord LIMIT 1),
        (SELECT r.reason FROM r WHERE r.kind = t.kind AND r.all_keys AND NOT r.by_res ORDER BY r.ord LIMIT 1)),
        t.wait_reason
    FROM flotilla_tasks t
    WHERE t.status IN ('queued', 'scheduled', 'retrying') AND (t.status = 'queued' OR t.run_at <= ?)
      AND t.bucket IN (SELECT value FROM json_each(?))` + waitingRows + `
), todo(id, reason) AS (
    SELECT id, reason FROM named WHERE reason IS NOT NULL AND cur <> reason
    ORDER BY id
    LIMIT ?
)
UPDATE flotilla_tasks SET wait_reason = (SELECT reason FROM todo WHERE todo.id = flotilla_tasks.id)
WHERE id IN (SELECT id FROM todo)`
}

// SetWaitReasons writes reasons on the waiting tasks they name.
func (s *Store) SetWaitReasons(ctx context.Context, owner string, buckets []store.HeldBucket, reasons []store.WaitReason) (int, error) {
	if len(reasons) == 0 || len(buckets) == 0 {
		return 0, s.checkOpen()
	}
	rows := make([][6]any, len(reasons))
	query := setResourceWaitReasonsSQL
	for i, r := range reasons {
		if !r.AllKeys || !r.ByResources {
			query = setWaitReasonsSQL
		}
		free := r.Free
		if free == nil {
			free = store.Resources{}
		}
		rows[i] = [6]any{r.Kind, r.LimitKey, r.AllKeys, r.ByResources, free, r.Reason}
	}
	reasonsJSON, _ := json.Marshal(rows)
	var n int64
	err := s.write(ctx, func(tx *wtx) error {
		_, live, err := liveEpochs(tx, store.ClaimRequest{Owner: owner, Buckets: buckets})
		if err != nil || len(live) == 0 {
			n = 0
			return err
		}
		res, err := tx.exec(query, string(reasonsJSON), tx.now.UnixMicro(), intsJSON(live), store.MaxWaitReasonRows)
		if err != nil {
			return wrap(err, "write wait reasons")
		}
		n, err = res.RowsAffected()
		return wrapIf(err, "write wait reasons")
	})
	if err != nil {
		return 0, requireSchema(err)
	}
	return int(n), nil
}

// AdvanceAndClaimLimited writes the outcomes, then claims (see
// store.AdvanceThenClaim).
func (s *Store) AdvanceAndClaimLimited(ctx context.Context, owner string, batch []store.ActiveTransition,
	req store.ClaimRequest, lc store.LimitedClaim) ([]store.Outcome, []*task.Task, error) {
	return store.AdvanceThenClaim(ctx, s, owner, batch, req, lc)
}
