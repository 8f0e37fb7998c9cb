package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// judgeSQL is the time at which acquireSQL judges lease expiry: the
// statement's own, or the requester's reckoning of the database's clock
// ($6) when that is earlier (store.AcquireRequest.JudgeAt).
const judgeSQL = `least(statement_timestamp(), coalesce($6::timestamptz, statement_timestamp()))`

// acquireSQL acquires or renews bucket leases in one statement. taken locks,
// in bucket order (so that nodes asking for overlapping sets never
// deadlock), only the rows the owner may take: its own live ones, and free,
// released or expired ones among those it may take ($5, every requested
// bucket when NULL); a live lease of another owner is read but not locked,
// so that a standby asking every tick does not get in its holder's way. A
// renewal of the owner's live lease keeps the epoch, and takes up a lease
// handed to it (reported acquired); every other acquisition, the owner's own
// return after its lease expired included, raises it and leaves no
// hand-off behind.
const acquireSQL = `
WITH req AS (
    SELECT DISTINCT unnest($1::int[]) AS bucket
), taken AS (
    SELECT l.bucket,
           coalesce(l.owner = $2::text AND l.expires_at > ` + judgeSQL + `, false) AS renewing,
           coalesce(l.owner = $2::text AND l.expires_at > ` + judgeSQL + `
                    AND l.handed_by IS NOT NULL AND l.handoff_epoch = l.epoch, false) AS taken_up
    FROM flotilla_bucket_leases l
    WHERE l.bucket = ANY($1::int[])
      AND ((l.owner = $2::text AND l.expires_at > ` + judgeSQL + `)
           OR ((l.owner IS NULL OR l.expires_at IS NULL OR l.expires_at <= ` + judgeSQL + `)
               AND ($5::int[] IS NULL OR l.bucket = ANY($5::int[]))))
    ORDER BY l.bucket
    FOR UPDATE
), upd AS (
    UPDATE flotilla_bucket_leases l SET
        owner = $2::text,
        node = $3::text,
        epoch = CASE WHEN k.renewing THEN l.epoch ELSE l.epoch + 1 END,
        acquired_at = CASE WHEN k.renewing THEN l.acquired_at ELSE statement_timestamp() END,
        expires_at = statement_timestamp() + $4::bigint * interval '1 microsecond',
        renewed_at = statement_timestamp(),
        successor = CASE WHEN k.renewing THEN l.successor END,
        successor_node = CASE WHEN k.renewing THEN l.successor_node END,
        handoff_at = CASE WHEN k.renewing THEN l.handoff_at END,
        handed_by = NULL
    FROM taken k
    WHERE l.bucket = k.bucket
    RETURNING l.bucket, l.owner, l.node, l.epoch, l.expires_at, NOT k.renewing OR k.taken_up AS acquired
)
SELECT r.bucket, cur.bucket IS NOT NULL, u.bucket IS NOT NULL, coalesce(u.acquired, false),
       CASE WHEN u.bucket IS NOT NULL THEN u.owner
            WHEN cur.expires_at > ` + judgeSQL + ` THEN cur.owner END,
       CASE WHEN u.bucket IS NOT NULL THEN u.node
            WHEN cur.expires_at > ` + judgeSQL + ` THEN cur.node END,
       coalesce(u.epoch, cur.epoch, 0),
       coalesce(u.expires_at, cur.expires_at), statement_timestamp()
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
	var take any
	if req.Take != nil {
		take = bucketArray(*req.Take)
	}
	var judgeAt any
	if !req.JudgeAt.IsZero() {
		judgeAt = req.JudgeAt
	}
	args := []any{bucketArray(req.Buckets), req.Owner, req.Node, micros(req.TTL), take, judgeAt}
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
			asOf            time.Time
			leaseHeld, acqd bool
			epoch           int64
		)
		if err := rows.Scan(&b, &known, &leaseHeld, &acqd, &holder, &node, &epoch, &expiresAt, &asOf); err != nil {
			return nil, nil, err
		}
		if !known {
			missing = append(missing, int(b))
			continue
		}
		out = append(out, store.BucketLease{
			Bucket: int(b), Holder: holder.String, Node: node.String, Epoch: epoch,
			ExpiresAt: optTime(expiresAt), Held: leaseHeld, Acquired: acqd, AsOf: asOf,
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
    SET owner = NULL, node = NULL, expires_at = NULL, renewed_at = statement_timestamp(),
        successor = NULL, successor_node = NULL, handoff_at = NULL, handed_by = NULL
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
       epoch, expires_at,
       CASE WHEN expires_at > statement_timestamp() AND handoff_epoch = epoch THEN successor_node END,
       CASE WHEN expires_at > statement_timestamp() AND handoff_epoch = epoch THEN successor END,
       CASE WHEN expires_at > statement_timestamp() AND handoff_epoch = epoch THEN handoff_at END,
       CASE WHEN expires_at > statement_timestamp() AND handoff_epoch = epoch THEN handed_by END,
       pinned_to
FROM flotilla_bucket_leases
ORDER BY bucket`

// ListBuckets returns every bucket's lease, ascending. An expired or
// released lease has no holder, and no hand-off.
func (s *Store) ListBuckets(ctx context.Context) ([]store.BucketLease, error) {
	rows, err := s.pool.Query(ctx, listBucketsSQL)
	if err != nil {
		return nil, wrap(err, "list buckets")
	}
	defer rows.Close()
	var out []store.BucketLease
	for rows.Next() {
		var (
			b                                          int32
			holder, node, succ, succOwner, handed, pin pgtype.Text
			epoch                                      int64
			expiresAt, since                           pgtype.Timestamptz
		)
		if err := rows.Scan(&b, &holder, &node, &epoch, &expiresAt, &succ, &succOwner, &since, &handed, &pin); err != nil {
			return nil, wrap(err, "list buckets")
		}
		out = append(out, store.BucketLease{
			Bucket: int(b), Holder: holder.String, Node: node.String, Epoch: epoch, ExpiresAt: optTime(expiresAt),
			Successor: succ.String, SuccessorOwner: succOwner.String, HandoffSince: optTime(since),
			HandedBy: handed.String, Pin: pin.String,
		})
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "list buckets")
	}
	return out, nil
}

// lockHandoffsSQL locks, in bucket order, the leases a hand-off names that
// owner holds under the epochs named, unexpired: the same order as the
// renewal's, so that a node's hand-off and its own renewal never deadlock.
const lockHandoffsSQL = `
moves AS (
    SELECT * FROM unnest($2::int[], $3::bigint[], $4::text[], $5::text[]) AS m(bucket, epoch, succ, succ_node)
), locked AS (
    SELECT l.bucket, m.succ, m.succ_node
    FROM flotilla_bucket_leases l JOIN moves m ON m.bucket = l.bucket AND m.epoch = l.epoch
    WHERE l.owner = $1::text AND l.expires_at > statement_timestamp()
    ORDER BY l.bucket
    FOR UPDATE OF l
)`

// markHandoffSQL records (or, with no successor, clears) the successor of
// each lease the owner holds under the epoch named.
const markHandoffSQL = `
WITH ` + lockHandoffsSQL + `
UPDATE flotilla_bucket_leases l SET
    successor = k.succ, successor_node = k.succ_node,
    handoff_at = CASE WHEN k.succ IS NULL THEN NULL ELSE statement_timestamp() END,
    handed_by = NULL, handoff_epoch = l.epoch
FROM locked k
WHERE l.bucket = k.bucket
RETURNING l.bucket`

// handoffArgs are the arrays lockHandoffsSQL reads; an empty successor is
// NULL.
func handoffArgs(owner string, moves []store.Handoff) []any {
	bs := make([]int32, len(moves))
	epochs := make([]int64, len(moves))
	succ := make([]pgtype.Text, len(moves))
	succNode := make([]pgtype.Text, len(moves))
	for i, m := range moves {
		bs[i], epochs[i] = int32(m.Bucket), m.Epoch
		succ[i] = pgtype.Text{String: m.To, Valid: m.To != ""}
		succNode[i] = pgtype.Text{String: m.ToNode, Valid: m.To != ""}
	}
	return []any{owner, bs, epochs, succ, succNode}
}

// MarkHandoff records the successor of each bucket owner holds under the
// epoch named, or calls the hand-off off.
func (s *Store) MarkHandoff(ctx context.Context, owner string, moves []store.Handoff) ([]int, error) {
	if err := store.CheckHandoffs(moves, false); err != nil {
		return nil, err
	}
	if len(moves) == 0 {
		return []int{}, nil
	}
	if err := s.checkHandoffRange(ctx, moves); err != nil {
		return nil, err
	}
	rows, err := s.leases.Query(ctx, markHandoffSQL, handoffArgs(owner, moves)...)
	if err != nil {
		return nil, wrap(err, "mark the hand-off of buckets of %s", owner)
	}
	marked, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, wrap(err, "mark the hand-off of buckets of %s", owner)
	}
	out := make([]int, len(marked))
	for i, b := range marked {
		out[i] = int(b)
	}
	return bucket.Of(out...).Slice(), nil
}

// handOffSQL gives each lease the owner holds under the epoch named to its
// successor under the next epoch, and announces the buckets on
// TopicBuckets, in one statement. handed_by takes the giver's node id (a
// SET reads the row as it was).
var handOffSQL = `
WITH ` + lockHandoffsSQL + `, handed AS (
    UPDATE flotilla_bucket_leases l SET
        owner = k.succ, node = k.succ_node, epoch = l.epoch + 1,
        acquired_at = statement_timestamp(), renewed_at = statement_timestamp(),
        expires_at = statement_timestamp() + $6::bigint * interval '1 microsecond',
        successor = NULL, successor_node = NULL, handoff_at = NULL,
        handed_by = l.node, handoff_epoch = l.epoch + 1
    FROM locked k
    WHERE l.bucket = k.bucket
    RETURNING l.bucket, l.owner, l.node, l.epoch, l.expires_at, l.handed_by, l.pinned_to
), ` + bucketSetNotifySQL("notified", string(store.TopicBuckets), "SELECT bucket FROM handed") + `
SELECT bucket, owner, node, epoch, expires_at, handed_by, pinned_to, (SELECT count(*) FROM notified)
FROM handed ORDER BY bucket`

// HandOff gives each bucket owner holds under the epoch named to its
// successor, under the next epoch.
func (s *Store) HandOff(ctx context.Context, owner string, moves []store.Handoff, ttl time.Duration) ([]store.BucketLease, error) {
	if err := store.CheckHandOff(moves, ttl); err != nil {
		return nil, err
	}
	if len(moves) == 0 {
		return []store.BucketLease{}, nil
	}
	if err := s.checkHandoffRange(ctx, moves); err != nil {
		return nil, err
	}
	rows, err := s.leases.Query(ctx, handOffSQL, append(handoffArgs(owner, moves), micros(ttl))...)
	if err != nil {
		return nil, wrap(err, "hand off buckets of %s", owner)
	}
	defer rows.Close()
	out := []store.BucketLease{}
	for rows.Next() {
		var (
			l             store.BucketLease
			b             int32
			handed, pin   pgtype.Text
			expiresAt     time.Time
			notifications int64
		)
		if err := rows.Scan(&b, &l.Holder, &l.Node, &l.Epoch, &expiresAt, &handed, &pin, &notifications); err != nil {
			return nil, wrap(err, "hand off buckets of %s", owner)
		}
		l.Bucket, l.ExpiresAt, l.HandedBy, l.Pin = int(b), expiresAt.UTC(), handed.String, pin.String
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "hand off buckets of %s", owner)
	}
	return out, nil
}

// checkHandoffRange refuses a hand-off of a bucket the fleet does not have.
func (s *Store) checkHandoffRange(ctx context.Context, moves []store.Handoff) error {
	n, err := s.fleetSize(ctx)
	if err != nil {
		return err
	}
	for _, m := range moves {
		if m.Bucket >= n {
			return fmt.Errorf("hand off buckets: the fleet has no bucket %d (it has %d): %w", m.Bucket, n, store.ErrInvalid)
		}
	}
	return nil
}

// pinBucketsSQL sets or clears the pins and announces the buckets on
// TopicBuckets, so that their holders move them at once.
var pinBucketsSQL = `
WITH locked AS (
    SELECT bucket FROM flotilla_bucket_leases WHERE bucket = ANY($1::int[]) ORDER BY bucket FOR UPDATE
), pinned AS (
    UPDATE flotilla_bucket_leases l SET pinned_to = $2 FROM locked k WHERE l.bucket = k.bucket RETURNING l.bucket
), ` + bucketSetNotifySQL("notified", string(store.TopicBuckets), "SELECT bucket FROM pinned") + `
SELECT count(*) FROM notified`

// PinBuckets records or removes an operator's pins, and announces them.
func (s *Store) PinBuckets(ctx context.Context, buckets bucket.Set, node string) error {
	n, err := s.fleetSize(ctx)
	if err != nil {
		return err
	}
	if err := buckets.CheckRange(n); err != nil {
		return fmt.Errorf("pin buckets: %w: %w", err, store.ErrInvalid)
	}
	pin := pgtype.Text{String: node, Valid: node != ""}
	if _, err := s.pool.Exec(ctx, pinBucketsSQL, bucketArray(buckets), pin); err != nil {
		return wrap(err, "pin buckets %s", buckets)
	}
	return nil
}

func bucketArray(set bucket.Set) []int32 {
	out := make([]int32, 0, set.Len())
	for _, b := range set.Slice() {
		out = append(out, int32(b))
	}
	return out
}
