package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/store/storetest"
)

func TestContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{
		Parallel: true,
		Open: func(t *testing.T) store.Store {
			return open(t, testdb.New(t))
		},
		Reopen: func(t *testing.T, s store.Store) store.Store {
			return open(t, pg(t, s).Pool().Config().ConnString())
		},
		ExpireBucketLease: func(t *testing.T, s store.Store, bucket int) {
			exec(t, s, `UPDATE flotilla_bucket_leases SET expires_at = statement_timestamp() - interval '1 second'
				WHERE bucket = $1`, bucket)
		},
		ExpireTaskLease: func(t *testing.T, s store.Store, id int64) {
			exec(t, s, `UPDATE flotilla_tasks SET lease_expires_at = statement_timestamp() - interval '1 second'
				WHERE id = $1`, id)
		},
		ExpireNode: func(t *testing.T, s store.Store, incarnation string) {
			exec(t, s, `UPDATE flotilla_nodes SET expires_at = statement_timestamp() - interval '1 second'
				WHERE incarnation = $1`, incarnation)
		},
		SetSchemaVersion: func(t *testing.T, s store.Store, version int) {
			exec(t, s, `INSERT INTO flotilla_schema_migrations (version) VALUES ($1) ON CONFLICT DO NOTHING`, version)
		},
		LockTask: lockTask,
		AgeFinished: func(t *testing.T, s store.Store, id int64, by time.Duration) {
			exec(t, s, `UPDATE flotilla_tasks SET finished_at = finished_at - $2::bigint * interval '1 microsecond'
				WHERE id = $1 AND finished_at IS NOT NULL`, id, by.Microseconds())
		},
	})
}

// open connects a store to dsn, closed when the test ends (before testdb
// drops the database: cleanups run last registered first).
func open(t testing.TB, dsn string, opts ...postgres.Option) *postgres.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.New(ctx, dsn, opts...)
	if err != nil {
		t.Fatalf("postgres.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func pg(t testing.TB, s store.Store) *postgres.Store {
	t.Helper()
	p, ok := s.(*postgres.Store)
	if !ok {
		t.Fatalf("%T is not a *postgres.Store", s)
	}
	return p
}

// exec runs one statement directly on the store's database, failing the
// test unless it changed exactly one row.
func exec(t testing.TB, s store.Store, sql string, args ...any) {
	t.Helper()
	tag, err := pg(t, s).Pool().Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("%s changed %d rows, want 1", sql, tag.RowsAffected())
	}
}

// lockTask holds the task's row in a transaction of its own, as an
// operator's open transaction would, until unlock is called (or the test
// ends).
func lockTask(t *testing.T, s store.Store, id int64) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pg(t, s).Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM flotilla_tasks WHERE id = $1 FOR UPDATE`, id); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(unlock)
	return unlock
}
