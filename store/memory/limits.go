package memory

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// shareKey names one holder's row of a fleet-wide limit.
type shareKey struct{ limit, owner string }

// UpsertLimit creates or replaces a limit.
func (s *Store) UpsertLimit(ctx context.Context, l store.Limit) (store.Limit, error) {
	if err := store.CheckLimit(l); err != nil {
		return store.Limit{}, fmt.Errorf("limit %s: %w", store.Shorten(l.Name, 60), err)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return store.Limit{}, err
	}
	defer db.mu.Unlock()
	now := db.now()
	l.CreatedAt, l.UpdatedAt = now, now
	if old, ok := db.limits[l.Name]; ok {
		l.CreatedAt = old.CreatedAt
	}
	db.limits[l.Name] = &l
	return l, nil
}

// ListLimits returns every limit by name.
func (s *Store) ListLimits(ctx context.Context) ([]store.Limit, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	out := []store.Limit{}
	for _, name := range slices.Sorted(maps.Keys(db.limits)) {
		out = append(out, *db.limits[name])
	}
	return out, nil
}

// DeleteLimit removes a limit and its shares.
func (s *Store) DeleteLimit(ctx context.Context, name string) error {
	db, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer db.mu.Unlock()
	if _, ok := db.limits[name]; !ok {
		return fmt.Errorf("limit %s: %w", store.Shorten(name, 60), store.ErrNotFound)
	}
	delete(db.limits, name)
	for k := range db.shares {
		if k.limit == name {
			delete(db.shares, k)
		}
	}
	return nil
}

// ClaimLimited claims as ClaimTasks does, within the rooms lc names.
func (s *Store) ClaimLimited(ctx context.Context, req store.ClaimRequest, lc store.LimitedClaim) ([]*task.Task, error) {
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
	view := lc.View()

	// The candidates: the first Scan due tasks in claim order that no
	// closed kind or key rules out.
	scan := lc.ScanOf(req.Limit)
	cands := make([]*taskRecord, 0, scan)
	fresh := make([]*taskRecord, 0, scan)
	open := func(rec *taskRecord) bool {
		_, held := epochs[rec.Bucket]
		return held && kinds[rec.Kind] && due(&rec.Task, now) && !view.Closed(&rec.Task)
	}
	for _, rec := range db.unfinished {
		if open(rec) {
			cands = keepBest(cands, rec, scan)
		}
	}
	first := make([]*task.Task, len(cands))
	for i, rec := range cands {
		first[i] = &rec.Task
	}
	second := view.SecondWalk(first)
	for _, rec := range db.unfinished {
		if open(rec) && second(&rec.Task) {
			fresh = keepBest(fresh, rec, scan)
		}
	}
	for _, rec := range fresh {
		if i, found := slices.BinarySearchFunc(cands, rec, claimOrder); !found {
			cands = slices.Insert(cands, i, rec)
		}
	}
	tasks := make([]*task.Task, len(cands))
	for i, rec := range cands {
		tasks[i] = &rec.Task
	}
	lease := dbTime(now.Add(req.LeaseTTL))
	for _, i := range view.Pick(tasks, req.Limit) {
		rec := cands[i]
		epoch := epochs[rec.Bucket]
		rec.ClaimSeq++
		rec.Attempt++
		rec.Owner = req.Owner
		rec.Node = req.Node
		rec.Epoch = epoch
		rec.LeaseExpiresAt = lease
		rec.StartedAt = now
		rec.WaitReason = ""
		db.move(rec, task.Running, moveDetails{reason: "claimed", node: req.Node, epoch: epoch}, now)
		claimed = append(claimed, rec.snapshot())
	}
	return claimed, nil
}

// ActiveUse lists the active tasks of the buckets.
func (s *Store) ActiveUse(ctx context.Context, buckets []int) ([]store.ActiveUse, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	want := map[int]bool{}
	for _, b := range buckets {
		want[b] = true
	}
	out := []store.ActiveUse{}
	for _, rec := range db.unfinished {
		if rec.Status.Active() && want[rec.Bucket] {
			out = append(out, activeUseOf(rec))
		}
	}
	slices.SortFunc(out, func(a, b store.ActiveUse) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// ListKeyUse counts the active tasks by kind, node and limit key.
func (s *Store) ListKeyUse(ctx context.Context) ([]store.KeyUse, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	counts := map[store.KeyUse]int{}
	for _, rec := range db.unfinished {
		if rec.Status.Active() {
			counts[store.KeyUse{Kind: rec.Kind, Node: rec.Node, LimitKey: store.LimitKeyOf(rec.Key, rec.LimitKey)}]++
		}
	}
	out := make([]store.KeyUse, 0, len(counts))
	for k, n := range counts {
		k.Active = n
		out = append(out, k)
	}
	slices.SortFunc(out, store.CompareKeyUse)
	return out, nil
}

func activeUseOf(rec *taskRecord) store.ActiveUse {
	return store.ActiveUse{
		ID: rec.ID, Kind: rec.Kind, LimitKey: store.LimitKeyOf(rec.Key, rec.LimitKey),
		Resources: maps.Clone(rec.Resources), Bucket: rec.Bucket, Owner: rec.Owner, Epoch: rec.Epoch,
		ClaimSeq: rec.ClaimSeq,
	}
}

// TakeShare renews the owner's share of a fleet-wide limit. The database's
// one lock stands for the row lock on the limit.
func (s *Store) TakeShare(ctx context.Context, req store.ShareRequest) (store.Share, error) {
	if req.Owner == "" || req.TTL <= 0 {
		return store.Share{}, fmt.Errorf("%w: a share needs an owner and a positive TTL (got %q, %v)", store.ErrInvalid, req.Owner, req.TTL)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return store.Share{}, err
	}
	defer db.mu.Unlock()
	now := db.now()
	l, ok := db.limits[req.Limit]
	if !ok || l.Per != store.PerFleet || l.Concurrency == 0 {
		return store.Share{Limit: req.Limit}, nil
	}
	held := map[int]bool{}
	for _, b := range req.Buckets {
		held[b] = true
	}
	queued := 0
	running := map[string]int{}
	for _, rec := range db.unfinished {
		if rec.Kind != l.Kind {
			continue
		}
		if rec.Status.Active() && rec.Owner != req.Owner {
			running[rec.Owner]++
		}
		if held[rec.Bucket] && due(&rec.Task, now) && req.Capacity.Covers(rec.Resources) {
			queued++
		}
	}
	demand := min(req.Running+queued, l.Concurrency, max(req.MaxDemand, req.Running))
	demands := map[string]int{req.Owner: demand}
	others := 0
	for k, sh := range db.shares {
		if k.limit != l.Name || k.owner == req.Owner {
			continue
		}
		live := now.Before(sh.ExpiresAt)
		if live {
			demands[k.owner] = sh.Demand
			others += max(sh.Share, running[k.owner])
		} else {
			others += running[k.owner]
		}
		delete(running, k.owner)
	}
	for _, n := range running { // owners without a share row
		others += n
	}
	grant := store.GrantShare(l.Concurrency, store.FairShare(l.Concurrency, demands, req.Owner), others)
	row := &store.ShareUse{Limit: l.Name, Owner: req.Owner, Node: req.Node, Share: grant, Demand: demand,
		ExpiresAt: dbTime(now.Add(req.TTL))}
	db.shares[shareKey{l.Name, req.Owner}] = row
	return store.Share{Limit: l.Name, Kind: l.Kind, N: l.Concurrency, Share: grant, Demand: demand,
		ExpiresAt: row.ExpiresAt, Found: true}, nil
}

// ListShares returns every share row.
func (s *Store) ListShares(ctx context.Context) ([]store.ShareUse, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	now := db.now()
	out := []store.ShareUse{}
	for _, sh := range db.shares {
		u := *sh
		u.Alive = now.Before(u.ExpiresAt)
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b store.ShareUse) int {
		return cmp.Or(cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Node, b.Node), cmp.Compare(a.Owner, b.Owner))
	})
	return out, nil
}

// SetWaitReasons writes reasons on the waiting tasks of the keys named.
func (s *Store) SetWaitReasons(ctx context.Context, owner string, buckets []store.HeldBucket, reasons []store.WaitReason) (int, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer db.mu.Unlock()
	now := db.now()
	held := map[int]bool{}
	for _, hb := range buckets {
		if hb.Bucket >= 0 && hb.Bucket < len(db.leases) && db.leases[hb.Bucket].liveFor(owner, hb.Epoch, now) {
			held[hb.Bucket] = true
		}
	}
	ids := slices.Sorted(maps.Keys(db.unfinished))
	n := 0
	for _, id := range ids {
		rec := db.unfinished[id]
		if !held[rec.Bucket] || !due(&rec.Task, now) {
			continue
		}
		reason, named := store.WaitReasonFor(reasons, rec.Kind, store.LimitKeyOf(rec.Key, rec.LimitKey), rec.Resources)
		if !named || rec.WaitReason == reason {
			continue
		}
		if n == store.MaxWaitReasonRows {
			break
		}
		rec.WaitReason = reason
		n++
	}
	return n, nil
}

// AdvanceAndClaimLimited writes the outcomes, then claims (see
// store.AdvanceThenClaim).
func (s *Store) AdvanceAndClaimLimited(ctx context.Context, owner string, batch []store.ActiveTransition,
	req store.ClaimRequest, lc store.LimitedClaim) ([]store.Outcome, []*task.Task, error) {
	return store.AdvanceThenClaim(ctx, s, owner, batch, req, lc)
}
