package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// acquireSQL acquires or renews bucket leases in one statement. taken locks,
// in bucket order (so that nodes asking for overlapping sets never
// deadlock), only the rows the owner may take: free, released, expired or
// its own; a live lease of another owner is read but not locked, so that a
// standby asking every tick does not get in its holder's way. A renewal of
// the owner's live lease keeps the epoch; every other acquisition, the
// owner's own return after its lease expired included, raises it.
const acquireSQL = `
WITH req AS (
    SELECT DISTINCT unnest($1::int[]) AS bucket
), taken AS (
    SELECT l.bucket,
           coalesce(l.owner = $2::text AND l.expires_at > statement_timestamp(), false) AS renewing
    FROM flotilla_bucket_leases l
    WHERE l.bucket = ANY($1::int[])
      AND (l.owner IS NULL OR l.expires_at IS NULL OR l.expires_at <= statement_timestamp() OR l.owner = $2::text)
    ORDER BY l.bucket
    FOR UPDATE
), upd AS (
    UPDATE flotilla_bucket_leases l SET
        owner = $2::text,
        node = $3::text,
        epoch = CASE WHEN k.renewing THEN l.epoch ELSE l.epoch + 1 END,
        acquired_at = CASE WHEN k.renewing THEN l.acquired_at ELSE statement_timestamp() END,
        expires_at = statement_timestamp() + $4::bigint * interval '1 microsecond',
        renewed_at = statement_timestamp()
    FROM taken k
    WHERE l.bucket = k.bucket
    RETURNING l.bucket, l.owner, l.node, l.epoch, l.expires_at, NOT k.renewing AS acquired
)
SELECT r.bucket, cur.bucket IS NOT NULL, u.bucket IS NOT NULL, coalesce(u.acquired, false),
       CASE WHEN u.bucket IS NOT NULL THEN u.owner
            WHEN cur.expires_at > statement_timestamp() THEN cur.owner END,
       CASE WHEN u.bucket IS NOT NULL THEN u.node
            WHEN cur.expires_at > statement_timestamp() THEN cur.node END,
       coalesce(u.epoch, cur.epoch, 0),
       coalesce(u.expires_at, cur.expires_at)
FROM req r
LEFT JOIN upd u ON u.bucket = r.bucket
LEFT JOIN flotilla_bucket_leases cur ON cur.bucket = r.bucket
ORDER BY r.bucket`

// AcquireBuckets acquires or renews the leases of req.Buckets for req.Owner
// and reports every requested bucket, ascending.
func (s *Store) AcquireBuckets(ctx context.Context, req store.AcquireRequest) ([]store.BucketLease, error) {
	if req.Buckets.Empty() {
		return nil, nil
	}
	if req.Owner == "" {
		return nil, fmt.Errorf("acquire buckets: no owner: %w", store.ErrInvalid)
	}
	if req.TTL <= 0 {
		return nil, fmt.Errorf("acquire buckets: TTL %v is not positive: %w", req.TTL, store.ErrInvalid)
	}
	n, err := s.fleetSize(ctx)
	if err != nil {
		return nil, err
	}
	if err := req.Buckets.CheckRange(n); err != nil {
		return nil, fmt.Errorf("acquire buckets: %w: %w", err, store.ErrInvalid)
	}
	var (
		out     []store.BucketLease
		missing []int
	)
	args := []any{bucketArray(req.Buckets), req.Owner, req.Node, micros(req.TTL)}
	err = settledTxOn(ctx, s.leases, acquireSettingSQL, acquireSQL, args, func(rows pgx.Rows) error {
		var err error
		out, missing, err = scanLeases(rows)
		return err
	})
	if err != nil {
		return nil, wrap(err, "acquire buckets %s", req.Buckets)
	}
	if len(missing) > 0 {
		// The leases that exist were taken all the same; the caller asked
		// for buckets the fleet does not have, which is a configuration
		// error to report rather than skip.
		return nil, fmt.Errorf("acquire buckets: the fleet has no bucket %s: %w", bucket.Of(missing...), store.ErrInvalid)
	}
	return out, nil
}

// acquireSettingSQL has acquireSQL planned without sequential scans. The
// lease table holds a row per bucket of the fleet and is rarely analyzed:
// planned for a table it knew nothing of, a renewal read it whole three
// times, 1,024 rows for a node holding 16, at each heartbeat of each node,
// a cost that grew with the fleet. Without them the named leases are
// probes of the primary key (TestALeaseRenewalReadsOnlyItsBuckets). The
// plan stays a custom one, made for the number of buckets named: a generic
// one joins them in nested loops, quadratic for a node holding them all.
const acquireSettingSQL = `SELECT set_config('enable_seqscan', 'off', true)`

// scanLeases reads acquireSQL's rows: the leases, and the buckets named
// that the fleet does not have.
func scanLeases(rows pgx.Rows) (out []store.BucketLease, missing []int, err error) {
	for rows.Next() {
		var (
			b               int32
			known           bool
			holder, node    pgtype.Text
			expiresAt       pgtype.Timestamptz
			leaseHeld, acqd bool
			epoch           int64
		)
		if err := rows.Scan(&b, &known, &leaseHeld, &acqd, &holder, &node, &epoch, &expiresAt); err != nil {
			return nil, nil, err
		}
		if !known {
			missing = append(missing, int(b))
			continue
		}
		out = append(out, store.BucketLease{
			Bucket: int(b), Holder: holder.String, Node: node.String, Epoch: epoch,
			ExpiresAt: optTime(expiresAt), Held: leaseHeld, Acquired: acqd,
		})
	}
	return out, missing, rows.Err()
}

// releaseSQL frees the owner's leases (all of them when $2 is NULL) and, in
// the same statement, announces the released buckets on TopicBuckets. The
// epoch stays: the next acquisition raises it.
var releaseSQL = `
WITH released AS (
    UPDATE flotilla_bucket_leases
    SET owner = NULL, node = NULL, expires_at = NULL, renewed_at = statement_timestamp()
    WHERE owner = $1::text AND ($2::int[] IS NULL OR bucket = ANY($2::int[]))
    RETURNING bucket
), ` + bucketSetNotifySQL("notified", string(store.TopicBuckets), "SELECT bucket FROM released") + `
SELECT bucket, (SELECT count(*) FROM notified) FROM released ORDER BY bucket`

// ReleaseBuckets gives up owner's leases on buckets (all of owner's when
// buckets is empty) and returns the buckets released, ascending.
func (s *Store) ReleaseBuckets(ctx context.Context, owner string, buckets bucket.Set) ([]int, error) {
	var filter any
	if !buckets.Empty() {
		filter = bucketArray(buckets)
	}
	rows, err := s.leases.Query(ctx, releaseSQL, owner, filter)
	if err != nil {
		return nil, wrap(err, "release buckets of %s", owner)
	}
	defer rows.Close()
	out := []int{}
	for rows.Next() {
		var (
			b     int32
			noted int64
		)
		if err := rows.Scan(&b, &noted); err != nil {
			return nil, wrap(err, "release buckets of %s", owner)
		}
		out = append(out, int(b))
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "release buckets of %s", owner)
	}
	return out, nil
}

const listBucketsSQL = `
SELECT bucket,
       CASE WHEN expires_at > statement_timestamp() THEN owner END,
       CASE WHEN expires_at > statement_timestamp() THEN node END,
       epoch, expires_at
FROM flotilla_bucket_leases
ORDER BY bucket`

// ListBuckets returns every bucket's lease, ascending. An expired or
// released lease has no holder.
func (s *Store) ListBuckets(ctx context.Context) ([]store.BucketLease, error) {
	rows, err := s.pool.Query(ctx, listBucketsSQL)
	if err != nil {
		return nil, wrap(err, "list buckets")
	}
	defer rows.Close()
	var out []store.BucketLease
	for rows.Next() {
		var (
			b            int32
			holder, node pgtype.Text
			epoch        int64
			expiresAt    pgtype.Timestamptz
		)
		if err := rows.Scan(&b, &holder, &node, &epoch, &expiresAt); err != nil {
			return nil, wrap(err, "list buckets")
		}
		out = append(out, store.BucketLease{
			Bucket: int(b), Holder: holder.String, Node: node.String, Epoch: epoch, ExpiresAt: optTime(expiresAt),
		})
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "list buckets")
	}
	return out, nil
}

func bucketArray(set bucket.Set) []int32 {
	out := make([]int32, 0, set.Len())
	for _, b := range set.Slice() {
		out = append(out, int32(b))
	}
	return out
}
