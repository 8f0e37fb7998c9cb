package memory

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// ClaimTasks moves due, claimable tasks of the caller's live buckets to
// running for the caller.
func (s *Store) ClaimTasks(ctx context.Context, req store.ClaimRequest) ([]*task.Task, error) {
	if req.Owner == "" {
		return nil, fmt.Errorf("%w: a claim needs the owner's incarnation", store.ErrInvalid)
	}
	if req.LeaseTTL <= 0 {
		return nil, fmt.Errorf("%w: task lease TTL %v is not positive", store.ErrInvalid, req.LeaseTTL)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()

	claimed := []*task.Task{}
	if req.Limit <= 0 || len(req.Kinds) == 0 {
		return claimed, nil
	}
	now := db.now()
	// The claim joins the bucket lease: only buckets the caller holds now,
	// under the epoch it names, are looked at.
	epochs := map[int]int64{}
	for _, hb := range req.Buckets {
		if hb.Bucket >= 0 && hb.Bucket < len(db.leases) && db.leases[hb.Bucket].liveFor(req.Owner, hb.Epoch, now) {
			epochs[hb.Bucket] = hb.Epoch
		}
	}
	if len(epochs) == 0 {
		return claimed, nil
	}
	kinds := map[string]bool{}
	for _, k := range req.Kinds {
		kinds[k] = true
	}

	best := make([]*taskRecord, 0, req.Limit)
	for _, rec := range db.unfinished {
		// A task that needs resources is the limited claim's, which knows
		// the node's capacity.
		if _, held := epochs[rec.Bucket]; held && kinds[rec.Kind] && len(rec.Resources) == 0 && due(&rec.Task, now) {
			best = keepBest(best, rec, req.Limit)
		}
	}
	lease := dbTime(now.Add(req.LeaseTTL))
	for _, rec := range best {
		epoch := epochs[rec.Bucket]
		rec.ClaimSeq++
		rec.Attempt++
		rec.Owner = req.Owner
		rec.Node = req.Node
		rec.Epoch = epoch
		rec.LeaseExpiresAt = lease
		rec.StartedAt = now
		db.move(rec, task.Running, moveDetails{reason: "claimed", node: req.Node, epoch: epoch}, now)
		claimed = append(claimed, rec.snapshot())
	}
	return claimed, nil
}

// due reports whether t can be claimed now: queued, or scheduled or
// retrying with its run_at passed.
func due(t *task.Task, now time.Time) bool {
	return t.Status == task.Queued || t.Status.Claimable() && !t.RunAt.After(now)
}

// claimOrder is the order of the claim: priority descending, then run_at,
// then id.
func claimOrder(a, b *taskRecord) int {
	if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
		return c
	}
	if c := a.RunAt.Compare(b.RunAt); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}

// keepBest inserts rec into best, kept sorted by claimOrder and no longer
// than limit, so that a claim of a few tasks does not sort the whole queue.
func keepBest(best []*taskRecord, rec *taskRecord, limit int) []*taskRecord {
	if len(best) == limit && claimOrder(rec, best[limit-1]) >= 0 {
		return best
	}
	i, _ := slices.BinarySearchFunc(best, rec, claimOrder)
	if len(best) == limit {
		best = best[:limit-1]
	}
	return slices.Insert(best, i, rec)
}

// RenewTaskLeases extends the leases of the named attempts that the owner
// still runs under its bucket's current epoch; a task locked by LockTask is
// busy.
func (s *Store) RenewTaskLeases(ctx context.Context, owner string, refs []task.Ref, ttl time.Duration) (store.Renewal, error) {
	if ttl <= 0 {
		return store.Renewal{}, fmt.Errorf("%w: task lease TTL %v is not positive", store.ErrInvalid, ttl)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return store.Renewal{}, err
	}
	defer db.mu.Unlock()

	now := db.now()
	lease := dbTime(now.Add(ttl))
	var out store.Renewal
	for _, ref := range refs {
		rec := db.task(ref.ID)
		switch {
		case rec == nil:
		case db.locked[ref.ID] > 0:
			out.Busy = append(out.Busy, ref)
		// Unlike completion, renewal needs a live bucket lease, as the
		// claim does: a holder past its lease must not extend its tasks.
		case db.attemptIsCurrent(rec, owner, ref) && db.leases[rec.Bucket].live(now):
			rec.LeaseExpiresAt = lease
			rec.UpdatedAt = now
			out.Renewed = append(out.Renewed, ref)
		}
	}
	return out, nil
}

// attemptIsCurrent is the fence of every write about an active attempt: the
// task is still active under this claim_seq and owner, and the owner still
// holds the task's bucket under the epoch of the claim. An expired bucket
// lease still passes: nobody can have taken the bucket, and so rescued the
// task, without raising the epoch.
func (db *database) attemptIsCurrent(rec *taskRecord, owner string, ref task.Ref) bool {
	l := db.leases[rec.Bucket]
	return rec.Status.Active() && rec.ClaimSeq == ref.ClaimSeq && rec.Owner == owner &&
		l.holder == owner && l.epoch == rec.Epoch
}

// AdvanceActive applies fenced transitions of active attempts, one outcome
// per input.
func (s *Store) AdvanceActive(ctx context.Context, owner string, batch []store.ActiveTransition) ([]store.Outcome, error) {
	for i, at := range batch {
		if err := checkJSON("result", at.Result); err != nil {
			return nil, fmt.Errorf("transition at index %d (task %d): %w", i, at.Ref.ID, err)
		}
		if err := checkJSON("progress", at.Progress); err != nil {
			return nil, fmt.Errorf("transition at index %d (task %d): %w", i, at.Ref.ID, err)
		}
	}
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()

	now := db.now()
	out := make([]store.Outcome, len(batch))
	for i, at := range batch {
		out[i] = db.advance(owner, at, now)
	}
	return out, nil
}

func (db *database) advance(owner string, at store.ActiveTransition, now time.Time) store.Outcome {
	rec := db.task(at.Ref.ID)
	if rec == nil {
		return store.Outcome{ID: at.Ref.ID, Err: taskNotFound(at.Ref.ID)}
	}
	if !db.attemptIsCurrent(rec, owner, at.Ref) {
		return store.Outcome{ID: rec.ID, Status: rec.Status, Err: store.ErrFenced}
	}
	to, err := db.destination(rec, at.To)
	if err != nil {
		return store.Outcome{ID: rec.ID, Status: rec.Status, Err: err}
	}
	var appended []task.Step
	if len(at.Append) > 0 && to.Terminal() {
		appended, err = db.checkAppend(rec, at.Append)
		if err != nil {
			// The attempt's work cannot be recorded as it asked: it fails,
			// saying why (a pending stop still wins).
			at.Error = err.Error()
			at.Reason = "appending steps refused"
			if to, err = db.destination(rec, task.Failed); err != nil {
				return store.Outcome{ID: rec.ID, Status: rec.Status, Err: err}
			}
		}
	}
	if at.Result != nil {
		rec.Result = jsonOrNull(at.Result)
	}
	if at.Progress != nil {
		rec.Progress = jsonOrNull(at.Progress)
	}
	m := moveDetails{reason: at.Reason, errText: at.Error, node: at.Node, epoch: rec.Epoch, delay: at.Delay}
	db.move(rec, to, m, now)
	if len(appended) > 0 {
		db.appendSteps(rec, appended, m, now)
	}
	return store.Outcome{ID: rec.ID, Status: rec.Status}
}

// SaveProgress records a running attempt's progress, fenced like
// AdvanceActive.
func (s *Store) SaveProgress(ctx context.Context, owner string, ref task.Ref, progress json.RawMessage) error {
	if err := checkJSON("progress", progress); err != nil {
		return fmt.Errorf("task %d: %w", ref.ID, err)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer db.mu.Unlock()
	rec := db.task(ref.ID)
	if rec == nil {
		return taskNotFound(ref.ID)
	}
	if !db.attemptIsCurrent(rec, owner, ref) {
		return fmt.Errorf("progress of task %d attempt with claim_seq %d: %w", ref.ID, ref.ClaimSeq, store.ErrFenced)
	}
	rec.Progress = jsonOrNull(progress)
	rec.UpdatedAt = db.now()
	return nil
}

// defaultScanLimit bounds ExpiredTasks and DueSchedules when the caller
// names no limit.
const defaultScanLimit = 100

// ExpiredTasks lists active tasks of the given buckets whose lease has run
// out, or that were claimed under an older epoch of their bucket, oldest
// task first.
func (s *Store) ExpiredTasks(ctx context.Context, buckets []store.HeldBucket, limit int) ([]*task.Task, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()

	now := db.now()
	held := map[int]int64{}
	for _, hb := range buckets {
		held[hb.Bucket] = hb.Epoch
	}
	var expired []*taskRecord
	for _, rec := range db.unfinished {
		epoch, ok := held[rec.Bucket]
		if ok && rec.Status.Active() && (!now.Before(rec.LeaseExpiresAt) || rec.Epoch < epoch) {
			expired = append(expired, rec)
		}
	}
	slices.SortFunc(expired, func(a, b *taskRecord) int { return cmp.Compare(a.ID, b.ID) })
	expired = expired[:min(len(expired), limitOr(limit, defaultScanLimit))]
	out := make([]*task.Task, len(expired))
	for i, rec := range expired {
		out[i] = rec.snapshot()
	}
	return out, nil
}

// BucketBacklog counts queued, waiting and active tasks per bucket that has
// any, ascending.
func (s *Store) BucketBacklog(ctx context.Context) ([]store.Backlog, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()

	now := db.now()
	counts := map[int]*store.Backlog{}
	for _, rec := range db.unfinished {
		if !rec.Status.Claimable() && !rec.Status.Active() {
			continue // pending and paused wait for something other than a holder
		}
		b := counts[rec.Bucket]
		if b == nil {
			b = &store.Backlog{Bucket: rec.Bucket}
			counts[rec.Bucket] = b
		}
		switch {
		case due(&rec.Task, now):
			b.Queued++
			if b.OldestDue.IsZero() || rec.RunAt.Before(b.OldestDue) {
				b.OldestDue = rec.RunAt
			}
		case rec.Status.Claimable():
			b.Waiting++
		default:
			b.Active++
		}
	}
	out := make([]store.Backlog, 0, len(counts))
	for _, b := range counts {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b store.Backlog) int { return cmp.Compare(a.Bucket, b.Bucket) })
	return out, nil
}
