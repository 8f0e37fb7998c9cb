package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// SchemaVersion is the schema version this store is at after Migrate. It
// stands in for the PostgreSQL store's migration number so that the schema
// checks of Meta and Migrate can be exercised here too.
const SchemaVersion = 1

// ErrClosed is returned by every method of a handle after its Close.
var ErrClosed = errors.New("memory store: closed")

var (
	_ store.Store    = (*Store)(nil)
	_ store.Notifier = (*Store)(nil)
)

// Store is one handle on an in-memory database; make one with [New]. It is
// safe for concurrent use; handles made by [Store.Handle] share the data.
type Store struct {
	db     *database
	closed atomic.Bool
}

// database is the data every handle shares: what the tables of the
// PostgreSQL store hold. One mutex guards all of it, so each method is a
// single atomic step, like one transaction.
type database struct {
	mu    sync.Mutex
	clock func() time.Time

	// schemaVersion is what a migration table would record; 0 until the
	// first Migrate.
	schemaVersion int
	// fleet is nil until the first Migrate: before it there are no tables.
	fleet *store.Meta

	tasks      []*taskRecord // task id n is tasks[n-1]
	unfinished map[int64]*taskRecord
	// uniqueKeys maps the unique key of every unfinished task to its id.
	uniqueKeys map[string]int64
	// fired maps (schedule, scheduled_for) to the task created for that
	// tick: the unique constraint that makes a schedule fire once per tick.
	fired map[fireKey]int64

	leases []bucketLease // one per bucket of the fleet

	nodes map[string]*store.NodeInfo // by node id

	commands       []*store.Command // command id n is commands[n-1]
	commandsByTask map[int64][]*store.Command

	schedules map[string]*store.Schedule

	pipelines []*pipelineRecord // pipeline id n is pipelines[n-1]
	// dependents maps a pipeline task's id to the edges of the tasks that
	// depend on it: what the PostgreSQL store's dependency table indexes by
	// dependency.
	dependents map[int64][]depEdge
	limits     map[string]*store.Limit
	shares     map[shareKey]*store.ShareUse

	// locked counts the LockTask holds on each task: what another
	// transaction's row lock is in PostgreSQL. Renewal reports such a task
	// busy, and a Transition with NoWait refuses it with ErrBusy.
	locked map[int64]int

	subscriptions map[*subscription]struct{}

	console consoleTables
}

// Option configures New.
type Option func(*database)

// WithClock makes now the store's database clock. Every lease, due time and
// timestamp is computed from it. The default (and what nil means) is
// time.Now.
func WithClock(now func() time.Time) Option {
	return func(db *database) {
		if now != nil {
			db.clock = now
		}
	}
}

// New returns a store on fresh, empty data. Like a new PostgreSQL database it
// has no schema until Migrate is called.
func New(opts ...Option) *Store {
	db := &database{
		clock:          time.Now,
		unfinished:     map[int64]*taskRecord{},
		uniqueKeys:     map[string]int64{},
		fired:          map[fireKey]int64{},
		nodes:          map[string]*store.NodeInfo{},
		commandsByTask: map[int64][]*store.Command{},
		schedules:      map[string]*store.Schedule{},
		dependents:     map[int64][]depEdge{},
		limits:         map[string]*store.Limit{},
		shares:         map[shareKey]*store.ShareUse{},
		subscriptions:  map[*subscription]struct{}{},
	}
	for _, opt := range opts {
		opt(db)
	}
	return &Store{db: db}
}

// Handle returns another handle on the same data, as a second process
// connected to the same database would have. Closing either handle leaves
// the other usable. It works on a closed handle too, like connecting again.
func (s *Store) Handle() *Store {
	return &Store{db: s.db}
}

// Close ends this handle and the subscriptions it opened. Closing twice is
// harmless.
func (s *Store) Close() {
	if s.closed.Swap(true) {
		return
	}
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	for sub := range s.db.subscriptions {
		if sub.handle == s {
			sub.stopWatching()
			s.db.endSubscription(sub)
		}
	}
}

// begin locks the data for one operation, the way a statement runs in a
// transaction. It refuses a closed handle, a finished context and, since
// no table exists before it, a store that was never migrated. The caller
// must unlock db.mu.
func (s *Store) begin(ctx context.Context) (*database, error) {
	db, err := s.beginUnmigrated(ctx)
	if err != nil {
		return nil, err
	}
	if db.fleet == nil {
		db.mu.Unlock()
		return nil, &store.SchemaError{Database: 0, Binary: SchemaVersion}
	}
	return db, nil
}

// beginUnmigrated is begin for the operations that need no schema.
func (s *Store) beginUnmigrated(ctx context.Context) (*database, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.db.mu.Lock()
	// Checked under the lock: Close marks the handle closed before it takes
	// the lock to end the handle's subscriptions, so a Listen that gets
	// past this check is seen, and ended, by that Close.
	if s.closed.Load() {
		s.db.mu.Unlock()
		return nil, ErrClosed
	}
	return s.db, nil
}

// Migrate creates the fleet on first use and checks it afterwards.
func (s *Store) Migrate(ctx context.Context, numBuckets int) (store.Meta, error) {
	if numBuckets != 0 {
		if _, err := bucket.NewPolicy(numBuckets); err != nil {
			return store.Meta{}, fmt.Errorf("%w: %w", store.ErrInvalid, err)
		}
	}
	db, err := s.beginUnmigrated(ctx)
	if err != nil {
		return store.Meta{}, err
	}
	defer db.mu.Unlock()

	// A binary never downgrades a schema written by a newer one; an older
	// schema is what Migrate is for, and is brought up to date.
	if db.schemaVersion > SchemaVersion {
		return store.Meta{}, &store.SchemaError{Database: db.schemaVersion, Binary: SchemaVersion}
	}
	if db.fleet == nil {
		if numBuckets == 0 {
			numBuckets = bucket.DefaultCount
		}
		db.fleet = &store.Meta{NumBuckets: numBuckets, CreatedAt: db.now()}
		db.leases = make([]bucketLease, numBuckets)
	} else if numBuckets != 0 && numBuckets != db.fleet.NumBuckets {
		return store.Meta{}, &store.BucketCountError{Fleet: db.fleet.NumBuckets, Requested: numBuckets}
	}
	db.schemaVersion = SchemaVersion
	return db.meta(), nil
}

// Meta reads the fleet's metadata.
func (s *Store) Meta(ctx context.Context) (store.Meta, error) {
	db, err := s.beginUnmigrated(ctx)
	if err != nil {
		return store.Meta{}, err
	}
	defer db.mu.Unlock()
	if db.schemaVersion != SchemaVersion {
		return store.Meta{}, &store.SchemaError{Database: db.schemaVersion, Binary: SchemaVersion}
	}
	if db.fleet == nil {
		return store.Meta{}, &store.SchemaError{Database: 0, Binary: SchemaVersion}
	}
	return db.meta(), nil
}

func (db *database) meta() store.Meta {
	m := *db.fleet
	m.SchemaVersion = db.schemaVersion
	return m
}

// Now is the store's clock, at the precision the store keeps.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	db, err := s.beginUnmigrated(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer db.mu.Unlock()
	return db.now(), nil
}

// now reads the database clock. db.mu must be held, so that one operation
// sees a single instant and operations are ordered in time.
func (db *database) now() time.Time {
	return dbTime(db.clock())
}

// dbTime brings a time to what the store keeps: UTC, microseconds, no
// monotonic reading. PostgreSQL's timestamptz keeps microseconds, so a
// value read back from either store compares the same way.
func dbTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Microsecond)
}

// checkBucket refuses a bucket number the fleet does not have.
func (db *database) checkBucket(b int) error {
	if b < 0 || b >= db.fleet.NumBuckets {
		return fmt.Errorf("%w: bucket %d does not exist: this fleet has %d buckets, numbered 0-%d",
			store.ErrInvalid, b, db.fleet.NumBuckets, db.fleet.NumBuckets-1)
	}
	return nil
}

// limitOr returns limit, or fallback when limit is not positive.
func limitOr(limit, fallback int) int {
	if limit <= 0 {
		return fallback
	}
	return limit
}
