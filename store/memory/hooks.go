package memory

import (
	"fmt"
	"sync"
	"time"

	"github.com/flotilla-dev/flotilla/store"
)

// The methods in this file are for tests only. They change the data the way
// a test against PostgreSQL changes a row directly, and they work on a closed
// handle as well. Expiry is set just before the store clock's now, so it
// holds for that clock: a ManualClock set backwards afterwards can revive a
// lease.

// ExpireBucketLease moves the expiry of bucket b's lease into the past. The
// holder stays recorded, as in the lease row: its fenced writes still pass
// until somebody takes the bucket.
func (s *Store) ExpireBucketLease(b int) error {
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.fleet == nil {
		return &store.SchemaError{Database: 0, Binary: SchemaVersion}
	}
	if err := db.checkBucket(b); err != nil {
		return err
	}
	if l := &db.leases[b]; l.holder != "" {
		l.expiresAt = db.justExpired()
	}
	return nil
}

// ExpireTaskLease moves the lease expiry of active task id into the past.
func (s *Store) ExpireTaskLease(id int64) error {
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	rec := db.task(id)
	if rec == nil {
		return taskNotFound(id)
	}
	if !rec.Status.Active() {
		return fmt.Errorf("%w: task %d is %s and holds no lease", store.ErrInvalid, id, rec.Status)
	}
	rec.LeaseExpiresAt = db.justExpired()
	return nil
}

// ExpireNode moves the liveness of a node incarnation into the past.
func (s *Store) ExpireNode(incarnation string) error {
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	n := db.registered(incarnation)
	if n == nil {
		return fmt.Errorf("node incarnation %s is not registered: %w", incarnation, store.ErrNotFound)
	}
	n.ExpiresAt = db.justExpired()
	return nil
}

// SetSchemaVersion records the schema as being at version, as a migration
// by another binary would. A version other than SchemaVersion makes Meta
// refuse with *store.SchemaError; a newer one makes Migrate refuse too,
// while an older one is what Migrate upgrades.
func (s *Store) SetSchemaVersion(version int) {
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	s.db.schemaVersion = version
}

// justExpired is an expiry that has passed by the store's clock.
func (db *database) justExpired() time.Time {
	return db.now().Add(-time.Microsecond)
}

// LockTask holds task id as another transaction's row lock would, until the
// returned function is called: RenewTaskLeases answers it busy, and a
// Transition with NoWait refuses it with store.ErrBusy.
func (s *Store) LockTask(id int64) (unlock func()) {
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.locked == nil {
		db.locked = map[int64]int{}
	}
	db.locked[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			db.mu.Lock()
			defer db.mu.Unlock()
			db.locked[id]--
		})
	}
}

// AgeFinished moves the end of finished task id by into the past, as if it
// had finished that long ago.
func (s *Store) AgeFinished(id int64, by time.Duration) error {
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	rec := db.task(id)
	if rec == nil {
		return taskNotFound(id)
	}
	if rec.FinishedAt.IsZero() {
		return fmt.Errorf("%w: task %d is %s and has not finished", store.ErrInvalid, id, rec.Status)
	}
	rec.FinishedAt = rec.FinishedAt.Add(-by)
	return nil
}
