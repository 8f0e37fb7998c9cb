package memory

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// bucketLease is one row of the bucket lease table. An expired lease keeps
// its holder: the holder's fenced writes stay valid until somebody else
// takes the bucket, which raises the epoch.
type bucketLease struct {
	holder    string // incarnation; "" when never held or released
	node      string
	epoch     int64
	expiresAt time.Time
	// successor (incarnation and node id) and handoffAt are the hand-off
	// the holder marked; handedBy the node that handed the lease to its
	// holder, until the holder takes it up. Both hold under handoffEpoch
	// only, so that any change of holder leaves them behind.
	successor, successorNode string
	handoffAt                time.Time
	handedBy                 string
	handoffEpoch             int64
	pin                      string // node id
}

// live reports whether somebody holds the lease at now.
func (l bucketLease) live(now time.Time) bool {
	return l.holder != "" && now.Before(l.expiresAt)
}

// liveFor reports whether owner holds the lease at now, under epoch.
func (l bucketLease) liveFor(owner string, epoch int64, now time.Time) bool {
	return l.live(now) && l.holder == owner && l.epoch == epoch
}

// view is the lease as readers see it: an expired lease has no holder.
func (db *database) view(b int, now time.Time) store.BucketLease {
	l := db.leases[b]
	out := store.BucketLease{Bucket: b, Epoch: l.epoch, ExpiresAt: l.expiresAt, Pin: l.pin}
	if l.live(now) {
		out.Holder, out.Node = l.holder, l.node
		if l.handoffEpoch == l.epoch {
			out.Successor, out.SuccessorOwner, out.HandoffSince = l.successorNode, l.successor, l.handoffAt
			out.HandedBy = l.handedBy
		}
	}
	return out
}

// newHolder is the lease taken by owner under the next epoch, with no
// hand-off: what a takeover leaves of the row.
func (l bucketLease) newHolder(owner, node string, expiresAt time.Time) bucketLease {
	return bucketLease{holder: owner, node: node, epoch: l.epoch + 1, expiresAt: expiresAt, pin: l.pin}
}

// checkBuckets refuses a set with a bucket the fleet does not have.
func (db *database) checkBuckets(set bucket.Set) error {
	if err := set.CheckRange(db.fleet.NumBuckets); err != nil {
		return fmt.Errorf("%w: %w", store.ErrInvalid, err)
	}
	return nil
}

// AcquireBuckets takes the free, released and expired leases among the
// requested buckets, renews the owner's live ones and leaves others' alone.
func (s *Store) AcquireBuckets(ctx context.Context, req store.AcquireRequest) ([]store.BucketLease, error) {
	if req.Owner == "" {
		return nil, fmt.Errorf("%w: a bucket lease needs the owner's incarnation", store.ErrInvalid)
	}
	if req.TTL <= 0 {
		return nil, fmt.Errorf("%w: bucket lease TTL %v is not positive", store.ErrInvalid, req.TTL)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	if err := db.checkBuckets(req.Buckets); err != nil {
		return nil, err
	}

	now := db.now()
	expiresAt := dbTime(now.Add(req.TTL))
	judge := store.JudgeTime(now, req.JudgeAt)
	out := make([]store.BucketLease, 0, req.Buckets.Len())
	for _, b := range req.Buckets.Slice() {
		l := &db.leases[b]
		renewal := l.live(judge) && l.holder == req.Owner
		// A lease handed to the owner is taken up at its first renewal.
		takenUp := renewal && l.handedBy != "" && l.handoffEpoch == l.epoch
		switch {
		case renewal:
			l.expiresAt = expiresAt
			l.node = req.Node
			if takenUp {
				l.handedBy = ""
			}
		case !l.live(judge) && (req.Take == nil || req.Take.Contains(b)):
			// A new holder, or the same one after its lease ran out: what
			// it did under the old epoch may have been rescued meanwhile,
			// so its old attempts must be fenced.
			*l = l.newHolder(req.Owner, req.Node, expiresAt)
		}
		lease := db.view(b, judge)
		lease.Held = l.holder == req.Owner && l.live(judge)
		lease.Acquired = lease.Held && (!renewal || takenUp)
		lease.AsOf = now
		out = append(out, lease)
	}
	return out, nil
}

// MarkHandoff records the successor of each bucket owner holds under the
// epoch named, or calls the hand-off off.
func (s *Store) MarkHandoff(ctx context.Context, owner string, moves []store.Handoff) ([]int, error) {
	if err := store.CheckHandoffs(moves, false); err != nil {
		return nil, err
	}
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	now := db.now()
	marked := []int{}
	err = db.eachHeld(owner, moves, now, func(m store.Handoff, l *bucketLease) {
		l.successor, l.successorNode, l.handedBy, l.handoffEpoch = m.To, m.ToNode, "", l.epoch
		l.handoffAt = time.Time{}
		if m.To != "" {
			l.handoffAt = now
		}
		marked = append(marked, m.Bucket)
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(marked)
	return marked, nil
}

// eachHeld calls fn with each move's lease that owner holds under the
// epoch named, unexpired at now; a move of a bucket the fleet does not have
// refuses the whole batch before anything changes.
func (db *database) eachHeld(owner string, moves []store.Handoff, now time.Time, fn func(store.Handoff, *bucketLease)) error {
	for _, m := range moves {
		if m.Bucket >= len(db.leases) {
			return fmt.Errorf("%w: the fleet has no bucket %d", store.ErrInvalid, m.Bucket)
		}
	}
	for _, m := range moves {
		if l := &db.leases[m.Bucket]; l.liveFor(owner, m.Epoch, now) {
			fn(m, l)
		}
	}
	return nil
}

// HandOff gives each bucket owner holds under the epoch named to its
// successor, under the next epoch, and announces them.
func (s *Store) HandOff(ctx context.Context, owner string, moves []store.Handoff, ttl time.Duration) ([]store.BucketLease, error) {
	if err := store.CheckHandOff(moves, ttl); err != nil {
		return nil, err
	}
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	now := db.now()
	handed := []store.BucketLease{}
	err = db.eachHeld(owner, moves, now, func(m store.Handoff, l *bucketLease) {
		next := l.newHolder(m.To, m.ToNode, dbTime(now.Add(ttl)))
		next.handedBy, next.handoffEpoch = l.node, next.epoch
		*l = next
		handed = append(handed, db.view(m.Bucket, now))
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(handed, func(a, b store.BucketLease) int { return a.Bucket - b.Bucket })
	if len(handed) > 0 {
		bs := make([]int, len(handed))
		for i, h := range handed {
			bs[i] = h.Bucket
		}
		db.publish(store.TopicBuckets, bucket.Of(bs...).String())
	}
	return handed, nil
}

// PinBuckets records or removes an operator's pins, and announces them, so
// that their holders move them at once.
func (s *Store) PinBuckets(ctx context.Context, buckets bucket.Set, node string) error {
	db, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer db.mu.Unlock()
	if err := db.checkBuckets(buckets); err != nil {
		return err
	}
	for _, b := range buckets.Slice() {
		db.leases[b].pin = node
	}
	if !buckets.Empty() {
		db.publish(store.TopicBuckets, buckets.String())
	}
	return nil
}

// ReleaseBuckets gives up owner's leases on buckets (all of owner's when
// buckets is empty) and announces the release, so that a standby can take
// them at once.
func (s *Store) ReleaseBuckets(ctx context.Context, owner string, buckets bucket.Set) ([]int, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	if err := db.checkBuckets(buckets); err != nil {
		return nil, err
	}

	candidates := buckets.Slice()
	if buckets.Empty() {
		candidates = bucket.All(db.fleet.NumBuckets).Slice()
	}
	released := []int{}
	for _, b := range candidates {
		l := &db.leases[b]
		// An owner's expired lease is released too: nobody else holds it,
		// and clearing it lets the next acquisition skip the wait.
		if owner != "" && l.holder == owner {
			*l = bucketLease{epoch: l.epoch, pin: l.pin}
			released = append(released, b)
		}
	}
	if len(released) > 0 {
		db.publish(store.TopicBuckets, bucket.Of(released...).String())
	}
	return released, nil
}

// ListBuckets returns every bucket's lease, ascending.
func (s *Store) ListBuckets(ctx context.Context) ([]store.BucketLease, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	now := db.now()
	out := make([]store.BucketLease, len(db.leases))
	for b := range db.leases {
		out[b] = db.view(b, now)
	}
	return out, nil
}
