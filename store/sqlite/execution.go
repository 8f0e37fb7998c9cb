package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// leaseRow is one row of flotilla_bucket_leases. An expired lease keeps its
// holder: the holder's fenced writes stay valid until somebody else takes
// the bucket, which raises the epoch.
type leaseRow struct {
	bucket    int
	owner     string
	node      string
	epoch     int64
	expiresAt time.Time
	// The hand-off (see the PostgreSQL store's migration 9): valid under
	// handoffEpoch only.
	successor, successorNode string
	handoffAt                time.Time
	handedBy                 string
	handoffEpoch             int64
	pin                      string
}

func (l leaseRow) live(now time.Time) bool {
	return l.owner != "" && now.Before(l.expiresAt)
}

func (l leaseRow) liveFor(owner string, epoch int64, now time.Time) bool {
	return l.live(now) && l.owner == owner && l.epoch == epoch
}

func scanLease(row scanner) (leaseRow, error) {
	var (
		l                                    leaseRow
		owner, nd, succ, succNode, hand, pin sql.NullString
		expiresAt, since, hEpoch             sql.NullInt64
	)
	if err := row.Scan(&l.bucket, &owner, &nd, &l.epoch, &expiresAt, &succ, &succNode, &since, &hand, &hEpoch,
		&pin); err != nil {
		return leaseRow{}, err
	}
	l.owner, l.node, l.expiresAt = owner.String, nd.String, fromMicros(expiresAt)
	l.successor, l.successorNode, l.handoffAt, l.handedBy, l.pin = succ.String, succNode.String, fromMicros(since),
		hand.String, pin.String
	l.handoffEpoch = -1
	if hEpoch.Valid {
		l.handoffEpoch = hEpoch.Int64
	}
	return l, nil
}

const leaseColumns = `bucket, owner, node, epoch, expires_at, successor, successor_node, handoff_at, handed_by,
	handoff_epoch, pinned_to`

func loadLease(tx *wtx, b int) (leaseRow, error) {
	l, err := scanLease(tx.queryRow(`SELECT `+leaseColumns+` FROM flotilla_bucket_leases WHERE bucket = ?`, b))
	if errors.Is(err, sql.ErrNoRows) {
		return leaseRow{bucket: b}, nil
	}
	if err != nil {
		return leaseRow{}, wrap(err, "read the lease of bucket %d", b)
	}
	return l, nil
}

// leaseLiveFor is the guard of reconcile's moves and of schedule firings:
// owner holds bucket b under epoch, unexpired by the database clock.
func leaseLiveFor(tx *wtx, b int, owner string, epoch int64) (bool, error) {
	l, err := loadLease(tx, b)
	if err != nil {
		return false, err
	}
	return l.liveFor(owner, epoch, tx.now), nil
}

// attemptIsCurrent is the fence of every write about an active attempt: the
// task is still active under this claim_seq and owner, and the owner still
// holds the task's bucket under the epoch of the claim. An expired bucket
// lease still passes: nobody can have taken the bucket, and so rescued the
// task, without raising the epoch.
func attemptIsCurrent(t *task.Task, l leaseRow, owner string, ref task.Ref) bool {
	return t.Status.Active() && t.ClaimSeq == ref.ClaimSeq && t.Owner == owner &&
		l.owner == owner && l.epoch == t.Epoch
}

// claimSQL picks the due tasks of the held buckets and kinds in the claim's
// order, walking flotilla_tasks_claim_idx from its front and stopping at the
// limit; the lease check is done in Go on the rows of the held buckets,
// which the write lock keeps still. Tasks that need resources are left to
// the limited claim, which knows the node's capacity.
const claimSQL = `SELECT ` + taskColumns + ` FROM flotilla_tasks
WHERE status IN ('queued', 'scheduled', 'retrying')
  AND (status = 'queued' OR run_at <= ?)
  AND bucket IN (SELECT value FROM json_each(?))
  AND kind IN (SELECT value FROM json_each(?))
  AND resources IS NULL
ORDER BY priority DESC, run_at, id
LIMIT ?`

// claimUpdateSQL moves the picked rows to running: what move does for a
// claim, in one statement. The epoch is each row's bucket's, from a JSON
// object of bucket to epoch.
const claimUpdateSQL = `UPDATE flotilla_tasks
SET status = 'running', status_version = status_version + 1, attempt = attempt + 1, claim_seq = claim_seq + 1,
    owner = ?, node = ?, epoch = json_extract(?, '$."' || bucket || '"'), lease_expires_at = ?,
    started_at = ?, updated_at = ?
WHERE id IN (SELECT value FROM json_each(?))`

func int64sJSON(v []int64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// ClaimTasks moves due, claimable tasks of the caller's live buckets to
// running for the caller.
func (s *Store) ClaimTasks(ctx context.Context, req store.ClaimRequest) ([]*task.Task, error) {
	if req.Owner == "" {
		return nil, fmt.Errorf("%w: a claim needs the owner's incarnation", store.ErrInvalid)
	}
	if req.LeaseTTL <= 0 {
		return nil, fmt.Errorf("%w: task lease TTL %v is not positive", store.ErrInvalid, req.LeaseTTL)
	}
	claimed := []*task.Task{}
	if req.Limit <= 0 || len(req.Kinds) == 0 || len(req.Buckets) == 0 {
		if err := s.checkOpen(); err != nil {
			return nil, err
		}
		return claimed, nil
	}
	err := s.write(ctx, func(tx *wtx) error {
		epochs, live, err := liveEpochs(tx, req)
		if err != nil || len(live) == 0 {
			return err
		}
		rows, err := tx.query(claimSQL, tx.now.UnixMicro(), intsJSON(live), stringsJSON(req.Kinds), req.Limit)
		if err != nil {
			return wrap(err, "claim")
		}
		var picked []*task.Task
		for rows.Next() {
			t, err := scanTask(rows)
			if err != nil {
				rows.Close()
				return wrap(err, "claim")
			}
			picked = append(picked, t)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return wrap(err, "claim")
		}
		if err := startPicked(tx, req, epochs, picked, claimUpdateSQL); err != nil {
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

// liveEpochs reads the leases of the buckets a claim names and keeps those
// the claimer holds live under the epoch it names: the epoch of each, and
// the list of them.
func liveEpochs(tx *wtx, req store.ClaimRequest) (map[int]int64, []int, error) {
	epochs := map[int]int64{}
	live := make([]int, 0, len(req.Buckets))
	for _, hb := range req.Buckets {
		l, err := loadLease(tx, hb.Bucket)
		if err != nil {
			return nil, nil, err
		}
		if l.liveFor(req.Owner, hb.Epoch, tx.now) {
			epochs[hb.Bucket] = hb.Epoch
			live = append(live, hb.Bucket)
		}
	}
	return epochs, live, nil
}

// startPicked moves the picked tasks of a claim to running with update
// (claimUpdateSQL or the limited claim's), records their events, and keeps
// the returned tasks in step with their rows.
func startPicked(tx *wtx, req store.ClaimRequest, epochs map[int]int64, picked []*task.Task, update string) error {
	if len(picked) == 0 {
		return nil
	}
	lease := dbTime(tx.now.Add(req.LeaseTTL))
	ids := make([]int64, len(picked))
	byBucket := map[string]int64{}
	for i, t := range picked {
		ids[i] = t.ID
		byBucket[fmt.Sprint(t.Bucket)] = epochs[t.Bucket]
	}
	// Every claimed row moves the same way, so one statement writes
	// them all.
	epochsJSON, _ := json.Marshal(byBucket)
	if _, err := tx.exec(update, req.Owner, req.Node, string(epochsJSON), lease.UnixMicro(),
		tx.now.UnixMicro(), tx.now.UnixMicro(), int64sJSON(ids)); err != nil {
		return wrap(err, "claim")
	}
	for _, t := range picked {
		epoch := epochs[t.Bucket]
		t.ClaimSeq++
		t.Attempt++
		t.Owner, t.Node, t.Epoch = req.Owner, req.Node, epoch
		t.LeaseExpiresAt = lease
		t.StartedAt = tx.now
		if err := move(tx, t, task.Running, moveDetails{reason: "claimed", node: req.Node, epoch: epoch, saved: true}); err != nil {
			return err
		}
	}
	return nil
}

// RenewTaskLeases extends the leases of the named attempts that the owner
// still runs under its bucket's current epoch, with a live bucket lease.
//
// SQLite locks the whole file for a write, not a row: while another
// process holds the write lock beyond the busy timeout, no renewal can be
// written, and every ref is answered busy (neither renewed nor lost), to be
// asked for again at the next renewal; a node whose renewals stay busy past
// its local deadline lets its attempts go, as a partitioned node does.
func (s *Store) RenewTaskLeases(ctx context.Context, owner string, refs []task.Ref, ttl time.Duration) (store.Renewal, error) {
	if ttl <= 0 {
		return store.Renewal{}, fmt.Errorf("%w: task lease TTL %v is not positive", store.ErrInvalid, ttl)
	}
	var out store.Renewal
	if len(refs) == 0 {
		return out, s.checkOpen()
	}
	err := s.write(ctx, func(tx *wtx) error {
		out = store.Renewal{}
		lease := dbTime(tx.now.Add(ttl))
		leases := map[int]leaseRow{}
		for _, ref := range refs {
			if s.isLocked(ref.ID) {
				out.Busy = append(out.Busy, ref)
				continue
			}
			t, err := loadTask(tx, ref.ID)
			if err != nil {
				return err
			}
			if t == nil {
				continue
			}
			l, ok := leases[t.Bucket]
			if !ok {
				if l, err = loadLease(tx, t.Bucket); err != nil {
					return err
				}
				leases[t.Bucket] = l
			}
			// Unlike completion, renewal needs a live bucket lease, as the
			// claim does: a holder past its lease must not extend its tasks.
			if !attemptIsCurrent(t, l, owner, ref) || !l.live(tx.now) {
				continue
			}
			if _, err := tx.exec(`UPDATE flotilla_tasks SET lease_expires_at = ?, updated_at = ? WHERE id = ?`,
				lease.UnixMicro(), tx.now.UnixMicro(), t.ID); err != nil {
				return wrap(err, "renew task %d", t.ID)
			}
			out.Renewed = append(out.Renewed, ref)
		}
		return nil
	})
	if errors.Is(err, store.ErrBusy) {
		return store.Renewal{Busy: append([]task.Ref(nil), refs...)}, nil
	}
	if err != nil {
		return store.Renewal{}, requireSchema(err)
	}
	return out, nil
}

// checkDoc refuses a document that is not JSON; nil or empty stands for
// null.
func checkDoc(what string, d json.RawMessage) error {
	if len(d) > 0 && !json.Valid(d) {
		return fmt.Errorf("%w: the %s is not valid JSON", store.ErrInvalid, what)
	}
	return nil
}

// AdvanceActive applies fenced transitions of active attempts, one outcome
// per input, in one transaction.
func (s *Store) AdvanceActive(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	for i, at := range batch {
		if !at.To.Valid() {
			return nil, fmt.Errorf("transition at index %d (task %d): %w: unknown task status %q", i, at.Ref.ID, store.ErrInvalid, at.To)
		}
		if err := checkDoc("result", at.Result); err != nil {
			return nil, fmt.Errorf("transition at index %d (task %d): %w", i, at.Ref.ID, err)
		}
		if err := checkDoc("progress", at.Progress); err != nil {
			return nil, fmt.Errorf("transition at index %d (task %d): %w", i, at.Ref.ID, err)
		}
	}
	out := make([]store.Outcome, len(batch))
	if len(batch) == 0 {
		return out, s.checkOpen()
	}
	err := s.write(ctx, func(tx *wtx) error {
		if err := prefetch(tx, batch); err != nil {
			return err
		}
		for i, at := range batch {
			o, err := advance(tx, owner, at)
			if err != nil {
				return err
			}
			out[i] = o
		}
		return nil
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return out, nil
}

// prefetch reads, in three statements, the rows a batch of transitions
// will look at: its tasks, their buckets' leases and their pending
// commands. Under the write lock they stay as read; the moves keep the
// cached tasks in step with their rows.
func prefetch(tx *wtx, batch []store.ActiveTransition) error {
	ids := make([]int64, len(batch))
	for i, at := range batch {
		ids[i] = at.Ref.ID
	}
	list := int64sJSON(ids)
	tx.tasks = make(map[int64]*task.Task, len(batch))
	rows, err := tx.query(`SELECT `+taskColumns+` FROM flotilla_tasks WHERE id IN (SELECT value FROM json_each(?))`, list)
	if err != nil {
		return wrap(err, "read the batch's tasks")
	}
	var buckets []int
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			rows.Close()
			return wrap(err, "read the batch's tasks")
		}
		tx.tasks[t.ID] = t
		buckets = append(buckets, t.Bucket)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return wrap(err, "read the batch's tasks")
	}
	tx.leases = map[int]leaseRow{}
	rows, err = tx.query(`SELECT `+leaseColumns+` FROM flotilla_bucket_leases WHERE bucket IN (SELECT value FROM json_each(?))`,
		intsJSON(buckets))
	if err != nil {
		return wrap(err, "read the batch's leases")
	}
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			rows.Close()
			return wrap(err, "read the batch's leases")
		}
		tx.leases[l.bucket] = l
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return wrap(err, "read the batch's leases")
	}
	tx.pending = map[int64][]pendingCommand{}
	rows, err = tx.query(`SELECT id, task_id, kind FROM flotilla_commands
		WHERE acked_at IS NULL AND task_id IN (SELECT value FROM json_each(?))`, list)
	if err != nil {
		return wrap(err, "read the batch's commands")
	}
	defer rows.Close()
	for rows.Next() {
		var (
			p      pendingCommand
			taskID int64
		)
		if err := rows.Scan(&p.id, &taskID, &p.kind); err != nil {
			return wrap(err, "read the batch's commands")
		}
		tx.pending[taskID] = append(tx.pending[taskID], p)
	}
	return wrapIf(rows.Err(), "read the batch's commands")
}

func advance(tx *wtx, owner string, at store.ActiveTransition) (store.Outcome, error) {
	t := tx.tasks[at.Ref.ID]
	if t == nil {
		return store.Outcome{ID: at.Ref.ID, Err: taskNotFound(at.Ref.ID)}, nil
	}
	l, ok := tx.leases[t.Bucket]
	if !ok {
		l = leaseRow{bucket: t.Bucket}
	}
	if !attemptIsCurrent(t, l, owner, at.Ref) {
		return store.Outcome{ID: t.ID, Status: t.Status, Err: store.ErrFenced}, nil
	}
	to, err := destination(t, at.To)
	if err != nil {
		return store.Outcome{ID: t.ID, Status: t.Status, Err: err}, nil
	}
	var appended []task.Step
	if len(at.Append) > 0 && to.Terminal() {
		if appended, err = checkAppend(tx, t, at.Append); err != nil {
			if !errors.Is(err, store.ErrInvalid) {
				return store.Outcome{}, err
			}
			// The attempt's work cannot be recorded as it asked: it fails,
			// saying why (a pending stop still wins).
			at.Error, at.Reason = err.Error(), "appending steps refused"
			if to, err = destination(t, task.Failed); err != nil {
				return store.Outcome{ID: t.ID, Status: t.Status, Err: err}, nil
			}
		}
	}
	if at.Result != nil {
		t.Result = jsonOrNull(at.Result)
	}
	if at.Progress != nil {
		t.Progress = jsonOrNull(at.Progress)
	}
	m := moveDetails{reason: at.Reason, errText: at.Error, node: at.Node, epoch: t.Epoch, delay: at.Delay}
	if err := move(tx, t, to, m); err != nil {
		return store.Outcome{}, err
	}
	if len(appended) > 0 {
		if err := appendSteps(tx, t, appended, m); err != nil {
			return store.Outcome{}, err
		}
	}
	return store.Outcome{ID: t.ID, Status: t.Status}, nil
}

// SaveProgress records a running attempt's progress, fenced like
// AdvanceActive.
func (s *Store) SaveProgress(ctx context.Context, owner string, ref task.Ref, progress json.RawMessage) error {
	if err := checkDoc("progress", progress); err != nil {
		return fmt.Errorf("task %d: %w", ref.ID, err)
	}
	err := s.write(ctx, func(tx *wtx) error {
		t, err := loadTask(tx, ref.ID)
		if err != nil {
			return err
		}
		if t == nil {
			return taskNotFound(ref.ID)
		}
		l, err := loadLease(tx, t.Bucket)
		if err != nil {
			return err
		}
		if !attemptIsCurrent(t, l, owner, ref) {
			return fmt.Errorf("progress of task %d attempt with claim_seq %d: %w", ref.ID, ref.ClaimSeq, store.ErrFenced)
		}
		_, err = tx.exec(`UPDATE flotilla_tasks SET progress = ?, updated_at = ? WHERE id = ?`,
			string(jsonOrNull(progress)), tx.now.UnixMicro(), t.ID)
		if err != nil {
			return wrap(err, "save the progress of task %d", t.ID)
		}
		return nil
	})
	return requireSchema(err)
}

const defaultScanLimit = 100

// ExpiredTasks lists active tasks of the given buckets whose lease has run
// out, or that were claimed under an older epoch of their bucket, by id.
func (s *Store) ExpiredTasks(ctx context.Context, buckets []store.HeldBucket, limit int) ([]*task.Task, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	out := []*task.Task{}
	if len(buckets) == 0 {
		return out, nil
	}
	held := make([]string, len(buckets))
	args := []any{}
	for i, hb := range buckets {
		held[i] = "(?, ?)"
		args = append(args, hb.Bucket, hb.Epoch)
	}
	args = append(args, limitOr(limit, defaultScanLimit))
	q := `WITH held(bucket, epoch) AS (VALUES ` + strings.Join(held, ", ") + `)
SELECT ` + prefixed("t.", taskColumns) + ` FROM flotilla_tasks t JOIN held h ON h.bucket = t.bucket
WHERE t.status IN ('running', 'stopping', 'pausing')
  AND (t.lease_expires_at <= ` + nowSQL + ` OR t.epoch < h.epoch)
ORDER BY t.id
LIMIT ?`
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, requireSchema(wrap(err, "expired tasks"))
	}
	defer rows.Close()
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, wrap(err, "expired tasks")
		}
		out = append(out, t)
	}
	return out, wrapIf(rows.Err(), "expired tasks")
}

func wrapIf(err error, what string) error {
	if err == nil {
		return nil
	}
	return wrap(err, "%s", what)
}

// prefixed qualifies every column of a column list.
func prefixed(prefix, columns string) string {
	parts := strings.Split(columns, ",")
	for i, p := range parts {
		parts[i] = prefix + strings.TrimSpace(p)
	}
	return strings.Join(parts, ", ")
}

// BucketBacklog counts queued, waiting and active tasks per bucket that has
// any, ascending.
func (s *Store) BucketBacklog(ctx context.Context) ([]store.Backlog, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `WITH c AS (SELECT `+nowSQL+` AS now)
SELECT bucket,
       sum(status = 'queued' OR (status IN ('scheduled', 'retrying') AND run_at <= c.now)),
       sum(status IN ('scheduled', 'retrying') AND run_at > c.now),
       sum(status IN ('running', 'stopping', 'pausing')),
       min(CASE WHEN status = 'queued' OR (status IN ('scheduled', 'retrying') AND run_at <= c.now) THEN run_at END)
FROM flotilla_tasks, c
WHERE status IN ('queued', 'scheduled', 'retrying', 'running', 'stopping', 'pausing')
GROUP BY bucket
ORDER BY bucket`)
	if err != nil {
		return nil, requireSchema(wrap(err, "bucket backlog"))
	}
	defer rows.Close()
	out := []store.Backlog{}
	for rows.Next() {
		var (
			b      store.Backlog
			oldest sql.NullInt64
		)
		if err := rows.Scan(&b.Bucket, &b.Queued, &b.Waiting, &b.Active, &oldest); err != nil {
			return nil, wrap(err, "bucket backlog")
		}
		b.OldestDue = fromMicros(oldest)
		out = append(out, b)
	}
	return out, wrapIf(rows.Err(), "bucket backlog")
}
