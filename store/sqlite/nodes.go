package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

const nodeColumns = `id, incarnation, buckets, kinds, version, started_at, heartbeat_at, expires_at, stopped_at,
	balance, leaving`

func scanNode(row scanner, now time.Time) (store.NodeInfo, error) {
	var (
		n                                  store.NodeInfo
		buckets, kinds                     string
		started, heartbeat, expires, stopd sql.NullInt64
	)
	if err := row.Scan(&n.ID, &n.Incarnation, &buckets, &kinds, &n.Version, &started, &heartbeat, &expires, &stopd,
		&n.Balance, &n.Leaving); err != nil {
		return store.NodeInfo{}, err
	}
	set, err := bucket.ParseSet(buckets, bucket.MaxCount)
	if err != nil {
		return store.NodeInfo{}, fmt.Errorf("node %s: buckets %q: %w", n.ID, buckets, err)
	}
	n.Buckets = set
	if err := json.Unmarshal([]byte(kinds), &n.Kinds); err != nil {
		return store.NodeInfo{}, fmt.Errorf("node %s: kinds %q: %w", n.ID, kinds, err)
	}
	n.StartedAt, n.HeartbeatAt, n.ExpiresAt, n.StoppedAt = fromMicros(started), fromMicros(heartbeat),
		fromMicros(expires), fromMicros(stopd)
	n.Alive = n.StoppedAt.IsZero() && now.Before(n.ExpiresAt)
	return n, nil
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
	err := s.write(ctx, func(tx *wtx) error {
		startedAt := tx.now
		prev, err := scanNode(tx.queryRow(`SELECT `+nodeColumns+` FROM flotilla_nodes WHERE id = ?`, n.ID), tx.now)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return wrap(err, "read node %s", n.ID)
		case prev.Incarnation == n.Incarnation:
			// The same process registering again keeps its start time.
			startedAt = prev.StartedAt
		case prev.Alive:
			return &store.NodeAliveError{NodeID: n.ID, Incarnation: prev.Incarnation}
		}
		_, err = tx.exec(`INSERT INTO flotilla_nodes (`+nodeColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)
			ON CONFLICT (id) DO UPDATE SET incarnation = excluded.incarnation, buckets = excluded.buckets,
			    kinds = excluded.kinds, version = excluded.version, started_at = excluded.started_at,
			    heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at, stopped_at = NULL,
			    balance = excluded.balance, leaving = excluded.leaving`,
			n.ID, n.Incarnation, n.Buckets.String(), stringsJSON(n.Kinds), n.Version, startedAt.UnixMicro(),
			tx.now.UnixMicro(), dbTime(tx.now.Add(ttl)).UnixMicro(), n.Balance, n.Leaving)
		if err != nil {
			return wrap(err, "register node %s", n.ID)
		}
		return nil
	})
	return requireSchema(err)
}

// HeartbeatNode extends the incarnation's liveness by ttl. A stopped
// incarnation is not brought back by a late heartbeat.
func (s *Store) HeartbeatNode(ctx context.Context, incarnation string, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: node TTL %v is not positive", store.ErrInvalid, ttl)
	}
	err := s.write(ctx, func(tx *wtx) error {
		res, err := tx.exec(`UPDATE flotilla_nodes SET heartbeat_at = ?, expires_at = ?
			WHERE incarnation = ? AND stopped_at IS NULL`,
			tx.now.UnixMicro(), dbTime(tx.now.Add(ttl)).UnixMicro(), incarnation)
		if err != nil {
			return wrap(err, "heartbeat of %s", incarnation)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("node incarnation %s is not registered: %w", incarnation, store.ErrNotFound)
		}
		return nil
	})
	return requireSchema(err)
}

// StopNode marks the incarnation stopped; stopping it again keeps the first
// stop time.
func (s *Store) StopNode(ctx context.Context, incarnation string) error {
	err := s.write(ctx, func(tx *wtx) error {
		res, err := tx.exec(`UPDATE flotilla_nodes SET stopped_at = coalesce(stopped_at, ?) WHERE incarnation = ?`,
			tx.now.UnixMicro(), incarnation)
		if err != nil {
			return wrap(err, "stop node %s", incarnation)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("node incarnation %s is not registered: %w", incarnation, store.ErrNotFound)
		}
		return nil
	})
	return requireSchema(err)
}

// ListNodes returns every registered node by id, with Alive by the
// database clock.
func (s *Store) ListNodes(ctx context.Context) ([]store.NodeInfo, error) {
	now, err := s.Now(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+nodeColumns+` FROM flotilla_nodes ORDER BY id`)
	if err != nil {
		return nil, requireSchema(wrap(err, "list nodes"))
	}
	defer rows.Close()
	out := []store.NodeInfo{}
	for rows.Next() {
		n, err := scanNode(rows, now)
		if err != nil {
			return nil, wrap(err, "list nodes")
		}
		out = append(out, n)
	}
	return out, wrapIf(rows.Err(), "list nodes")
}
