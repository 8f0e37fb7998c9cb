package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/store"
)

// registerNodeSQL records a node as live, replacing a row of the same id
// only when that one is stopped, expired, or the same incarnation
// registering again. RETURNING is empty when a live other incarnation
// holds the id.
const registerNodeSQL = `
INSERT INTO flotilla_nodes AS n
    (id, incarnation, buckets, kinds, version, started_at, heartbeat_at, expires_at, stopped_at, balance, leaving)
VALUES ($1, $2, $3, $4, $5, statement_timestamp(), statement_timestamp(),
        statement_timestamp() + $6::bigint * interval '1 microsecond', NULL, $7, $8)
ON CONFLICT (id) DO UPDATE SET
    incarnation = excluded.incarnation,
    balance = excluded.balance,
    leaving = excluded.leaving,
    buckets = excluded.buckets,
    kinds = excluded.kinds,
    version = excluded.version,
    started_at = CASE WHEN n.incarnation = excluded.incarnation AND n.stopped_at IS NULL
                      THEN n.started_at ELSE excluded.started_at END,
    heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at,
    stopped_at = NULL
WHERE n.stopped_at IS NOT NULL
   OR n.expires_at <= statement_timestamp()
   OR n.incarnation = excluded.incarnation
RETURNING n.id`

const nodeIncarnationSQL = `SELECT incarnation FROM flotilla_nodes WHERE id = $1`

// RegisterNode records n's incarnation as live for ttl, refusing with
// *store.NodeAliveError while another incarnation of the same id is live.
func (s *Store) RegisterNode(ctx context.Context, n store.NodeInfo, ttl time.Duration) error {
	if n.ID == "" || n.Incarnation == "" {
		return fmt.Errorf("register node: id and incarnation are required: %w", store.ErrInvalid)
	}
	if ttl <= 0 {
		return fmt.Errorf("register node %s: TTL %v is not positive: %w", n.ID, ttl, store.ErrInvalid)
	}
	kinds := n.Kinds
	if kinds == nil {
		kinds = []string{}
	}
	for {
		var id string
		err := s.pool.QueryRow(ctx, registerNodeSQL, n.ID, n.Incarnation, n.Buckets.String(), kinds, n.Version,
			micros(ttl), n.Balance, n.Leaving).Scan(&id)
		if err == nil {
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return wrap(err, "register node %s", n.ID)
		}
		var live string
		err = s.pool.QueryRow(ctx, nodeIncarnationSQL, n.ID).Scan(&live)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // the row went away in between: register again
		}
		if err != nil {
			return wrap(err, "register node %s", n.ID)
		}
		return &store.NodeAliveError{NodeID: n.ID, Incarnation: live}
	}
}

const heartbeatNodeSQL = `
UPDATE flotilla_nodes
SET heartbeat_at = statement_timestamp(), expires_at = statement_timestamp() + $2::bigint * interval '1 microsecond'
WHERE incarnation = $1 AND stopped_at IS NULL`

// HeartbeatNode extends the incarnation's liveness by ttl.
func (s *Store) HeartbeatNode(ctx context.Context, incarnation string, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("heartbeat of %s: TTL %v is not positive: %w", incarnation, ttl, store.ErrInvalid)
	}
	tag, err := s.leases.Exec(ctx, heartbeatNodeSQL, incarnation, micros(ttl))
	if err != nil {
		return wrap(err, "heartbeat of %s", incarnation)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("heartbeat of %s: it is not the registered incarnation of its node: %w", incarnation, store.ErrNotFound)
	}
	return nil
}

const stopNodeSQL = `
UPDATE flotilla_nodes SET stopped_at = coalesce(stopped_at, statement_timestamp())
WHERE incarnation = $1`

// StopNode marks the incarnation stopped. Stopping it again is not an
// error; an incarnation that is not (or no longer) registered is
// store.ErrNotFound.
func (s *Store) StopNode(ctx context.Context, incarnation string) error {
	tag, err := s.pool.Exec(ctx, stopNodeSQL, incarnation)
	if err != nil {
		return wrap(err, "stop %s", incarnation)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("stop %s: %w", incarnation, store.ErrNotFound)
	}
	return nil
}

const listNodesSQL = `
SELECT id, incarnation, buckets, kinds, version, started_at, heartbeat_at, expires_at, stopped_at,
       stopped_at IS NULL AND expires_at > statement_timestamp(), balance, leaving
FROM flotilla_nodes
ORDER BY id`

// ListNodes returns every registered node, with Alive by the database clock.
func (s *Store) ListNodes(ctx context.Context) ([]store.NodeInfo, error) {
	rows, err := s.pool.Query(ctx, listNodesSQL)
	if err != nil {
		return nil, wrap(err, "list nodes")
	}
	defer rows.Close()
	var out []store.NodeInfo
	for rows.Next() {
		var (
			n         store.NodeInfo
			buckets   string
			stoppedAt pgtype.Timestamptz
		)
		if err := rows.Scan(&n.ID, &n.Incarnation, &buckets, &n.Kinds, &n.Version, &n.StartedAt, &n.HeartbeatAt,
			&n.ExpiresAt, &stoppedAt, &n.Alive, &n.Balance, &n.Leaving); err != nil {
			return nil, wrap(err, "list nodes")
		}
		if err := n.Buckets.UnmarshalText([]byte(buckets)); err != nil {
			return nil, fmt.Errorf("list nodes: node %s has buckets %q: %w", n.ID, buckets, err)
		}
		n.StartedAt, n.HeartbeatAt, n.ExpiresAt = n.StartedAt.UTC(), n.HeartbeatAt.UTC(), n.ExpiresAt.UTC()
		n.StoppedAt = optTime(stoppedAt)
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "list nodes")
	}
	return out, nil
}
