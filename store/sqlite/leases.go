package sqlite

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// view is the lease as readers see it: an expired lease has no holder.
func (l leaseRow) view(now time.Time) store.BucketLease {
	out := store.BucketLease{Bucket: l.bucket, Epoch: l.epoch, ExpiresAt: l.expiresAt, Pin: l.pin}
	if l.live(now) {
		out.Holder, out.Node = l.owner, l.node
		if l.handoffEpoch == l.epoch {
			out.Successor, out.SuccessorOwner, out.HandoffSince = l.successorNode, l.successor, l.handoffAt
			out.HandedBy = l.handedBy
		}
	}
	return out
}

// takenUp reports whether the owner's renewal of l takes up a lease handed
// to it.
func (l leaseRow) takenUp(owner string, now time.Time) bool {
	return l.live(now) && l.owner == owner && l.handedBy != "" && l.handoffEpoch == l.epoch
}

func (s *Store) checkBuckets(ctx context.Context, set bucket.Set) error {
	n, err := s.fleetSize(ctx)
	if err != nil {
		return err
	}
	if err := set.CheckRange(n); err != nil {
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
	if err := s.checkBuckets(ctx, req.Buckets); err != nil {
		return nil, err
	}
	var out []store.BucketLease
	err := s.write(ctx, func(tx *wtx) error {
		out = make([]store.BucketLease, 0, req.Buckets.Len())
		expiresAt := dbTime(tx.now.Add(req.TTL))
		judge := store.JudgeTime(tx.now, req.JudgeAt)
		for _, b := range req.Buckets.Slice() {
			l, err := loadLease(tx, b)
			if err != nil {
				return err
			}
			renewal := l.live(judge) && l.owner == req.Owner
			takenUp := l.takenUp(req.Owner, judge)
			switch {
			case renewal:
				l.expiresAt, l.node, l.handedBy = expiresAt, req.Node, ""
				_, err = tx.exec(`UPDATE flotilla_bucket_leases SET node = ?, expires_at = ?, renewed_at = ?,
					handed_by = NULL WHERE bucket = ?`,
					req.Node, expiresAt.UnixMicro(), tx.now.UnixMicro(), b)
			case !l.live(judge) && (req.Take == nil || req.Take.Contains(b)):
				// A new holder, or the same one after its lease ran out:
				// what it did under the old epoch may have been rescued
				// meanwhile, so its old attempts must be fenced.
				l = leaseRow{bucket: b, owner: req.Owner, node: req.Node, epoch: l.epoch + 1, expiresAt: expiresAt,
					handoffEpoch: -1, pin: l.pin}
				_, err = tx.exec(`UPDATE flotilla_bucket_leases SET owner = ?, node = ?, epoch = ?, expires_at = ?,
					acquired_at = ?, renewed_at = ?, successor = NULL, successor_node = NULL, handoff_at = NULL,
					handed_by = NULL WHERE bucket = ?`,
					req.Owner, req.Node, l.epoch, expiresAt.UnixMicro(), tx.now.UnixMicro(), tx.now.UnixMicro(), b)
			}
			if err != nil {
				return wrap(err, "acquire bucket %d", b)
			}
			lease := l.view(judge)
			lease.Held = l.owner == req.Owner && l.live(judge)
			lease.Acquired = lease.Held && (!renewal || takenUp)
			lease.AsOf = tx.now
			out = append(out, lease)
		}
		return nil
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return out, nil
}

// ReleaseBuckets gives up owner's leases on buckets (all of owner's when
// buckets is empty) and announces the release, so that a standby can take
// them at once.
func (s *Store) ReleaseBuckets(ctx context.Context, owner string, buckets bucket.Set) ([]int, error) {
	if err := s.checkBuckets(ctx, buckets); err != nil {
		return nil, err
	}
	released := []int{}
	if owner == "" {
		return released, nil
	}
	err := s.write(ctx, func(tx *wtx) error {
		released = released[:0]
		// An owner's expired lease is released too: nobody else holds it,
		// and clearing it lets the next acquisition skip the wait.
		q := `UPDATE flotilla_bucket_leases SET owner = NULL, node = NULL, expires_at = NULL, successor = NULL,
			successor_node = NULL, handoff_at = NULL, handed_by = NULL WHERE owner = ?`
		args := []any{owner}
		if !buckets.Empty() {
			q += ` AND bucket IN (SELECT value FROM json_each(?))`
			args = append(args, intsJSON(buckets.Slice()))
		}
		rows, err := tx.query(q+` RETURNING bucket`, args...)
		if err != nil {
			return wrap(err, "release buckets")
		}
		defer rows.Close()
		for rows.Next() {
			var b int
			if err := rows.Scan(&b); err != nil {
				return wrap(err, "release buckets")
			}
			released = append(released, b)
		}
		if err := rows.Err(); err != nil {
			return wrap(err, "release buckets")
		}
		if len(released) > 0 {
			tx.notify(store.TopicBuckets, bucket.Of(released...).String())
		}
		return nil
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return bucket.Of(released...).Slice(), nil
}

// ListBuckets returns every bucket's lease, ascending.
func (s *Store) ListBuckets(ctx context.Context) ([]store.BucketLease, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	now, err := s.Now(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+leaseColumns+` FROM flotilla_bucket_leases ORDER BY bucket`)
	if err != nil {
		return nil, requireSchema(wrap(err, "list buckets"))
	}
	defer rows.Close()
	out := []store.BucketLease{}
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, wrap(err, "list buckets")
		}
		out = append(out, l.view(now))
	}
	return out, wrapIf(rows.Err(), "list buckets")
}

// MarkHandoff records the successor of each bucket owner holds under the
// epoch named, or calls the hand-off off.
func (s *Store) MarkHandoff(ctx context.Context, owner string, moves []store.Handoff) ([]int, error) {
	if err := store.CheckHandoffs(moves, false); err != nil {
		return nil, err
	}
	if err := s.checkBuckets(ctx, handoffBuckets(moves)); err != nil {
		return nil, err
	}
	var marked []int
	err := s.write(ctx, func(tx *wtx) error {
		marked = []int{}
		return eachHeld(tx, owner, moves, func(m store.Handoff, _ leaseRow) error {
			var succ, succNode, since any
			if m.To != "" {
				succ, succNode, since = m.To, m.ToNode, tx.now.UnixMicro()
			}
			if _, err := tx.exec(`UPDATE flotilla_bucket_leases SET successor = ?, successor_node = ?, handoff_at = ?,
				handed_by = NULL, handoff_epoch = epoch WHERE bucket = ?`, succ, succNode, since, m.Bucket); err != nil {
				return wrap(err, "mark the hand-off of bucket %d", m.Bucket)
			}
			marked = append(marked, m.Bucket)
			return nil
		})
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return bucket.Of(marked...).Slice(), nil
}

// HandOff gives each bucket owner holds under the epoch named to its
// successor, under the next epoch, and announces them.
func (s *Store) HandOff(ctx context.Context, owner string, moves []store.Handoff, ttl time.Duration) ([]store.BucketLease, error) {
	if err := store.CheckHandOff(moves, ttl); err != nil {
		return nil, err
	}
	if err := s.checkBuckets(ctx, handoffBuckets(moves)); err != nil {
		return nil, err
	}
	var handed []store.BucketLease
	err := s.write(ctx, func(tx *wtx) error {
		handed = []store.BucketLease{}
		var bs []int
		err := eachHeld(tx, owner, moves, func(m store.Handoff, l leaseRow) error {
			next := leaseRow{bucket: m.Bucket, owner: m.To, node: m.ToNode, epoch: l.epoch + 1,
				expiresAt: dbTime(tx.now.Add(ttl)), handedBy: l.node, handoffEpoch: l.epoch + 1, pin: l.pin}
			if _, err := tx.exec(`UPDATE flotilla_bucket_leases SET owner = ?, node = ?, epoch = ?, expires_at = ?,
				acquired_at = ?, renewed_at = ?, successor = NULL, successor_node = NULL, handoff_at = NULL,
				handed_by = ?, handoff_epoch = ? WHERE bucket = ?`,
				next.owner, next.node, next.epoch, next.expiresAt.UnixMicro(), tx.now.UnixMicro(), tx.now.UnixMicro(),
				next.handedBy, next.epoch, m.Bucket); err != nil {
				return wrap(err, "hand off bucket %d", m.Bucket)
			}
			handed = append(handed, next.view(tx.now))
			bs = append(bs, m.Bucket)
			return nil
		})
		if err != nil {
			return err
		}
		if len(bs) > 0 {
			tx.notify(store.TopicBuckets, bucket.Of(bs...).String())
		}
		return nil
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	slices.SortFunc(handed, func(a, b store.BucketLease) int { return a.Bucket - b.Bucket })
	return handed, nil
}

// eachHeld calls fn with each move's lease that owner holds under the
// epoch named, unexpired by the writer's clock.
func eachHeld(tx *wtx, owner string, moves []store.Handoff, fn func(store.Handoff, leaseRow) error) error {
	for _, m := range moves {
		l, err := loadLease(tx, m.Bucket)
		if err != nil {
			return err
		}
		if !l.liveFor(owner, m.Epoch, tx.now) {
			continue
		}
		if err := fn(m, l); err != nil {
			return err
		}
	}
	return nil
}

func handoffBuckets(moves []store.Handoff) bucket.Set {
	bs := make([]int, len(moves))
	for i, m := range moves {
		bs[i] = m.Bucket
	}
	return bucket.Of(bs...)
}

// PinBuckets records or removes an operator's pins, and announces them, so
// that their holders move them at once.
func (s *Store) PinBuckets(ctx context.Context, buckets bucket.Set, node string) error {
	if err := s.checkBuckets(ctx, buckets); err != nil {
		return err
	}
	var pin any
	if node != "" {
		pin = node
	}
	err := s.write(ctx, func(tx *wtx) error {
		_, err := tx.exec(`UPDATE flotilla_bucket_leases SET pinned_to = ? WHERE bucket IN (SELECT value FROM json_each(?))`,
			pin, intsJSON(buckets.Slice()))
		if err == nil && !buckets.Empty() {
			tx.notify(store.TopicBuckets, buckets.String())
		}
		return wrapIf(err, "pin buckets "+buckets.String())
	})
	return requireSchema(err)
}

// LockTask holds task id as another transaction's row lock does on
// PostgreSQL, until the returned function is called: RenewTaskLeases
// answers it busy, and a Transition with NoWait refuses it with
// store.ErrBusy. SQLite has no row locks (a writer locks the whole file,
// which the store answers the same way for every task; see
// RenewTaskLeases), so the contract suite's locked row is held here, in
// the handle, for tests.
func (s *Store) LockTask(id int64) (unlock func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locked == nil {
		s.locked = map[int64]int{}
	}
	s.locked[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.locked[id]--
		})
	}
}

func (s *Store) isLocked(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.locked[id] > 0
}
