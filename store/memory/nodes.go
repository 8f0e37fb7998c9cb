package memory

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-dev/flotilla/store"
)

// alive reports whether the node is live at now: not stopped, and its
// heartbeat has not run out.
func alive(n *store.NodeInfo, now time.Time) bool {
	return n.StoppedAt.IsZero() && now.Before(n.ExpiresAt)
}

// nodeView is a copy of n for a reader, with Alive computed at now.
func nodeView(n *store.NodeInfo, now time.Time) store.NodeInfo {
	out := *n
	out.Kinds = slices.Clone(n.Kinds)
	out.Alive = alive(n, now)
	return out
}

// RegisterNode records n's incarnation as live for ttl, unless another
// incarnation of the same node id is live.
func (s *Store) RegisterNode(ctx context.Context, n store.NodeInfo, ttl time.Duration) error {
	switch {
	case n.ID == "" || n.Incarnation == "":
		return fmt.Errorf("%w: a node needs an id and an incarnation", store.ErrInvalid)
	case ttl <= 0:
		return fmt.Errorf("%w: node TTL %v is not positive", store.ErrInvalid, ttl)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer db.mu.Unlock()

	now := db.now()
	startedAt := now
	if prev := db.nodes[n.ID]; prev != nil {
		switch {
		case prev.Incarnation == n.Incarnation:
			// The same process registering again keeps its start time.
			startedAt = prev.StartedAt
		case alive(prev, now):
			return &store.NodeAliveError{NodeID: n.ID, Incarnation: prev.Incarnation}
		}
	}
	db.nodes[n.ID] = &store.NodeInfo{
		ID:          n.ID,
		Incarnation: n.Incarnation,
		Buckets:     n.Buckets,
		Kinds:       slices.Clone(n.Kinds),
		Version:     n.Version,
		StartedAt:   startedAt,
		HeartbeatAt: now,
		ExpiresAt:   dbTime(now.Add(ttl)),
		Balance:     n.Balance,
		Leaving:     n.Leaving,
	}
	return nil
}

// registered finds the node record of an incarnation, or nil when another
// incarnation has replaced it.
func (db *database) registered(incarnation string) *store.NodeInfo {
	for _, n := range db.nodes {
		if n.Incarnation == incarnation {
			return n
		}
	}
	return nil
}

// HeartbeatNode extends the incarnation's liveness by ttl.
func (s *Store) HeartbeatNode(ctx context.Context, incarnation string, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: node TTL %v is not positive", store.ErrInvalid, ttl)
	}
	db, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer db.mu.Unlock()
	n := db.registered(incarnation)
	if n == nil || !n.StoppedAt.IsZero() {
		// A stopped incarnation is not brought back by a late heartbeat.
		return fmt.Errorf("node incarnation %s is not registered: %w", incarnation, store.ErrNotFound)
	}
	now := db.now()
	n.HeartbeatAt = now
	n.ExpiresAt = dbTime(now.Add(ttl))
	return nil
}

// StopNode marks the incarnation stopped. Stopping it again keeps the first
// stop time.
func (s *Store) StopNode(ctx context.Context, incarnation string) error {
	db, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer db.mu.Unlock()
	n := db.registered(incarnation)
	if n == nil {
		return fmt.Errorf("node incarnation %s is not registered: %w", incarnation, store.ErrNotFound)
	}
	if n.StoppedAt.IsZero() {
		n.StoppedAt = db.now()
	}
	return nil
}

// ListNodes returns every registered node by id, with Alive by the store's
// clock.
func (s *Store) ListNodes(ctx context.Context) ([]store.NodeInfo, error) {
	db, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()
	now := db.now()
	out := make([]store.NodeInfo, 0, len(db.nodes))
	for _, n := range db.nodes {
		out = append(out, nodeView(n, now))
	}
	slices.SortFunc(out, func(a, b store.NodeInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}
