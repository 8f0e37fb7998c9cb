package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/sqlite"
	"github.com/flotilla-dev/flotilla/store/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		OneWriter: true,
		Open: func(t *testing.T) store.Store {
			return open(t, filepath.Join(t.TempDir(), "flotilla.db"))
		},
		Reopen: func(t *testing.T, s store.Store) store.Store {
			return open(t, lite(t, s).Path())
		},
		ExpireBucketLease: func(t *testing.T, s store.Store, bucket int) {
			exec(t, s, `UPDATE flotilla_bucket_leases SET expires_at = `+nowMicros+` - 1000000 WHERE bucket = ?`, bucket)
		},
		ExpireTaskLease: func(t *testing.T, s store.Store, id int64) {
			exec(t, s, `UPDATE flotilla_tasks SET lease_expires_at = `+nowMicros+` - 1000000 WHERE id = ?`, id)
		},
		ExpireNode: func(t *testing.T, s store.Store, incarnation string) {
			exec(t, s, `UPDATE flotilla_nodes SET expires_at = `+nowMicros+` - 1000000 WHERE incarnation = ?`, incarnation)
		},
		SetSchemaVersion: func(t *testing.T, s store.Store, version int) {
			exec(t, s, `INSERT OR IGNORE INTO flotilla_schema_migrations (version) VALUES (?)`, version)
		},
		LockTask: func(t *testing.T, s store.Store, id int64) func() {
			unlock := lite(t, s).LockTask(id)
			t.Cleanup(unlock)
			return unlock
		},
		AgeFinished: func(t *testing.T, s store.Store, id int64, by time.Duration) {
			exec(t, s, `UPDATE flotilla_tasks SET finished_at = finished_at - ? WHERE id = ? AND finished_at IS NOT NULL`,
				by.Microseconds(), id)
		},
	})
}

// nowMicros is SQLite's clock in the store's unit, for statements that
// move a time into the past as an expired row would look.
const nowMicros = `(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000)`

// open opens a store on path, closed when the test ends.
func open(t testing.TB, path string, opts ...sqlite.Option) *sqlite.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := sqlite.New(ctx, path, opts...)
	if err != nil {
		t.Fatalf("sqlite.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func lite(t testing.TB, s store.Store) *sqlite.Store {
	t.Helper()
	l, ok := s.(*sqlite.Store)
	if !ok {
		t.Fatalf("%T is not a *sqlite.Store", s)
	}
	return l
}

// rawDB opens a connection of its own on the store's file, as another
// process would, closed when the test ends.
func rawDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// exec runs one statement on the store's file from another connection,
// failing the test unless it changed exactly one row.
func exec(t testing.TB, s store.Store, query string, args ...any) {
	t.Helper()
	res, err := rawDB(t, lite(t, s).Path()).Exec(query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("%s changed %d rows, want 1", query, n)
	}
}
