// Package tempfleet gives the examples a fleet that needs nothing
// installed: a migrated SQLite file in a temporary directory, removed when
// the example ends, and a way to wait for a task to reach a state.
package tempfleet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/store/sqlite"
	"github.com/flotilla-dev/flotilla/task"
)

// NumBuckets is the examples' bucket count: small, so that the three nodes
// of the failover example can split it by hand.
const NumBuckets = 16

// Fleet is an SQLite store on a file of its own, migrated to NumBuckets
// buckets, with a client on it.
type Fleet struct {
	Store  *sqlite.Store
	Client *flotilla.Client
	Path   string // the database file
	dir    string
}

// Open creates the file in a new temporary directory and migrates it.
func Open(ctx context.Context) (*Fleet, error) {
	dir, err := os.MkdirTemp("", "flotilla-example-")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "fleet.db")
	// A short outbox poll: every process and handle in an example shares
	// one file, and hears of the others' writes through its outbox.
	s, err := sqlite.New(ctx, path, sqlite.WithOutboxPoll(20*time.Millisecond))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if _, err := s.Migrate(ctx, NumBuckets); err != nil {
		s.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	c, err := flotilla.NewClient(ctx, s)
	if err != nil {
		s.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &Fleet{Store: s, Client: c, Path: path, dir: dir}, nil
}

// Close closes the store and removes the temporary directory.
func (f *Fleet) Close() {
	f.Client.Close()
	f.Store.Close()
	_ = os.RemoveAll(f.dir)
}

// Wait reads task id every 20ms until it is in one of the states given, or
// has ended in another (an error naming the state it ended in), or ctx ends.
func Wait(ctx context.Context, c *flotilla.Client, id int64, want ...task.Status) (*task.Task, error) {
	return Poll(ctx, c, id, func(t *task.Task) (bool, error) {
		switch {
		case slices.Contains(want, t.Status):
			return true, nil
		case t.Status.Terminal():
			return false, fmt.Errorf("task %d ended %s (error %q), not %v", id, t.Status, t.Error, want)
		}
		return false, nil
	})
}

// Poll reads task id every 20ms until done reports it done or an error, or
// ctx ends (an error naming the task's state and wait reason then).
func Poll(ctx context.Context, c *flotilla.Client, id int64, done func(*task.Task) (bool, error)) (*task.Task, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		t, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if ok, err := done(t); ok || err != nil {
			return t, err
		}
		select {
		case <-ctx.Done():
			return t, fmt.Errorf("task %d is still %s (waiting: %q): %w", id, t.Status, t.WaitReason,
				context.Cause(ctx))
		case <-tick.C:
		}
	}
}
