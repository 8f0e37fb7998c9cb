package sqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/sqlite"
)

// TestAMigrateThatFindsTheFileLockedWaitsForItsContext: a migration may
// hold the write lock past the busy timeout (migration 6 copies the task
// table), so a second process's Migrate waits for it until its own
// context ends, rather than failing at the busy timeout.
func TestAMigrateThatFindsTheFileLockedWaitsForItsContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flotilla.db")
	s := open(t, path, sqlite.WithBusyTimeout(time.Millisecond))

	other := rawDB(t, path)
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}

	// Locked throughout: Migrate gives up when its context does, saying
	// both why.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = s.Migrate(ctx, 16)
	cancel()
	if !errors.Is(err, store.ErrBusy) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Migrate on a file locked throughout = %v; want ErrBusy once its context ended", err)
	}

	// Unlocked while it waits: it goes on and migrates.
	done := make(chan error, 1)
	go func() {
		_, err := s.Migrate(context.Background(), 16)
		done <- err
	}()
	if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate once the lock was released: %v", err)
	}
}
