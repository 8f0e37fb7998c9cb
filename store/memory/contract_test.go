package memory_test

import (
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/store/storetest"
)

// TestContract runs the suite every store passes, with the default clock:
// the suite waits for real time where it needs time to pass, and expires
// leases through the hooks.
func TestContract(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		Open: func(t *testing.T) store.Store {
			s := memory.New()
			t.Cleanup(s.Close)
			return s
		},
		Reopen: func(t *testing.T, s store.Store) store.Store {
			other := asMemory(t, s).Handle()
			t.Cleanup(other.Close)
			return other
		},
		ExpireBucketLease: func(t *testing.T, s store.Store, bucket int) {
			t.Helper()
			if err := asMemory(t, s).ExpireBucketLease(bucket); err != nil {
				t.Fatal(err)
			}
		},
		ExpireTaskLease: func(t *testing.T, s store.Store, id int64) {
			t.Helper()
			if err := asMemory(t, s).ExpireTaskLease(id); err != nil {
				t.Fatal(err)
			}
		},
		ExpireNode: func(t *testing.T, s store.Store, incarnation string) {
			t.Helper()
			if err := asMemory(t, s).ExpireNode(incarnation); err != nil {
				t.Fatal(err)
			}
		},
		SetSchemaVersion: func(t *testing.T, s store.Store, version int) {
			asMemory(t, s).SetSchemaVersion(version)
		},
		LockTask: func(t *testing.T, s store.Store, id int64) func() {
			return asMemory(t, s).LockTask(id)
		},
		AgeFinished: func(t *testing.T, s store.Store, id int64, by time.Duration) {
			t.Helper()
			if err := asMemory(t, s).AgeFinished(id, by); err != nil {
				t.Fatal(err)
			}
		},
	})
}

func asMemory(t *testing.T, s store.Store) *memory.Store {
	t.Helper()
	m, ok := s.(*memory.Store)
	if !ok {
		t.Fatalf("the suite handed back a %T, not the memory store it opened", s)
	}
	return m
}
