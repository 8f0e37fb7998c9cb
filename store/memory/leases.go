package memory

import (
	"context"
	"fmt"
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
	out := store.BucketLease{Bucket: b, Epoch: l.epoch, ExpiresAt: l.expiresAt}
	if l.live(now) {
		out.Holder, out.Node = l.holder, l.node
	}
	return out
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
	out := make([]store.BucketLease, 0, req.Buckets.Len())
	for _, b := range req.Buckets.Slice() {
		l := &db.leases[b]
		renewal := l.live(now) && l.holder == req.Owner
		switch {
		case renewal:
			l.expiresAt = expiresAt
			l.node = req.Node
		case !l.live(now):
			// A new holder, or the same one after its lease ran out: what
			// it did under the old epoch may have been rescued meanwhile,
			// so its old attempts must be fenced.
			*l = bucketLease{holder: req.Owner, node: req.Node, epoch: l.epoch + 1, expiresAt: expiresAt}
		}
		lease := db.view(b, now)
		lease.Held = l.holder == req.Owner
		lease.Acquired = lease.Held && !renewal
		out = append(out, lease)
	}
	return out, nil
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
			*l = bucketLease{epoch: l.epoch}
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
