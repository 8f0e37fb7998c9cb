package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// TestLibrarySubmitOfAForeignKeyIsRefused embeds a node that owns half the
// buckets and checks invariant 6 on PostgreSQL: a task whose key hashes to
// a bucket the node does not own, or that has no key, is refused at submit
// time, naming the bucket and the owned set, and nothing is written.
func TestLibrarySubmitOfAForeignKeyIsRefused(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	dsn := testdb.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close) // after the node's shutdown, registered below
	meta, err := s.Migrate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	policy, err := bucket.NewPolicy(meta.NumBuckets)
	if err != nil {
		t.Fatal(err)
	}
	owned := mustSet(t, "0-31")
	n, err := node.New(s, node.Config{
		NodeID:  "library",
		Buckets: owned,
		Logger:  zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	if err != nil {
		t.Fatal(err)
	}
	n.Register("noop", func(context.Context, *task.Task) error { return nil })
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The test's context is over by now; shutdown gets its own.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})

	foreignKey := keyIn(t, policy, mustSet(t, "32-63"), "foreign")
	foreignBucket := policy.Of(foreignKey)
	_, err = n.Submit(ctx, node.SubmitRequest{Kind: "noop", Key: foreignKey})
	var foreign *bucket.ForeignBucketError
	switch {
	case !errors.As(err, &foreign):
		t.Errorf("Submit of key %q (bucket %d) returned %v, want a *bucket.ForeignBucketError", foreignKey, foreignBucket, err)
	case foreign.Key != foreignKey || foreign.Bucket != foreignBucket || !foreign.Owned.Equal(owned):
		t.Errorf("ForeignBucketError{Key: %q, Bucket: %d, Owned: %s}, want {%q, %d, %s}",
			foreign.Key, foreign.Bucket, foreign.Owned, foreignKey, foreignBucket, owned)
	case !strings.Contains(err.Error(), fmt.Sprint(foreignBucket)) || !strings.Contains(err.Error(), "0-31"):
		t.Errorf("the refusal %q does not name bucket %d and the owned set 0-31", err, foreignBucket)
	}

	_, err = n.Submit(ctx, node.SubmitRequest{Kind: "noop"})
	if missing := (*bucket.MissingKeyError)(nil); !errors.As(err, &missing) || !missing.Owned.Equal(owned) {
		t.Errorf("Submit without a key returned %v, want a *bucket.MissingKeyError naming 0-31", err)
	}

	tasks, err := s.ListTasks(ctx, store.TaskFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 0 {
		t.Fatalf("refused submissions wrote %d tasks, want none", len(tasks))
	}

	// The node does accept a key of its own, so the refusals above are
	// about ownership, not about submitting at all.
	ownKey := keyIn(t, policy, owned, "own")
	if _, err := n.Submit(ctx, node.SubmitRequest{Kind: "noop", Key: ownKey}); err != nil {
		t.Fatalf("Submit of own key %q: %v", ownKey, err)
	}
	tasks, err = s.ListTasks(ctx, store.TaskFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 1 || tasks[0].Key != ownKey {
		t.Errorf("after one accepted submission the store holds %d tasks, want the one with key %q", len(tasks), ownKey)
	}
}
