package storetest

import (
	"errors"
	"testing"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

func testNodes(t *testing.T, h Harness) {
	t.Run("RegisterHeartbeatStop", func(t *testing.T) {
		b := setup(t, h)
		n := store.NodeInfo{ID: "worker-1", Incarnation: "worker-1/aaa", Buckets: bucket.Of(0, 1, 2, 3),
			Kinds: []string{"noop", "sleep"}, Version: "v0.1.0"}
		if err := b.s.RegisterNode(b.ctx, n, leaseTTL); err != nil {
			t.Fatal(err)
		}
		nodes, err := b.s.ListNodes(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 1 {
			t.Fatalf("%d nodes", len(nodes))
		}
		got := nodes[0]
		if got.ID != n.ID || got.Incarnation != n.Incarnation || !got.Buckets.Equal(n.Buckets) ||
			len(got.Kinds) != 2 || got.Version != "v0.1.0" || !got.Alive || got.StartedAt.IsZero() ||
			got.HeartbeatAt.IsZero() || got.ExpiresAt.IsZero() {
			t.Errorf("node read back as %+v", got)
		}
		if err := b.s.HeartbeatNode(b.ctx, n.Incarnation, leaseTTL); err != nil {
			t.Errorf("heartbeat: %v", err)
		}
		if err := b.s.HeartbeatNode(b.ctx, "worker-1/zzz", leaseTTL); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("heartbeat of an unknown incarnation: %v, want store.ErrNotFound", err)
		}
		if err := b.s.StopNode(b.ctx, n.Incarnation); err != nil {
			t.Fatal(err)
		}
		nodes, _ = b.s.ListNodes(b.ctx)
		if nodes[0].Alive || nodes[0].StoppedAt.IsZero() {
			t.Errorf("stopped node: %+v", nodes[0])
		}
		if err := b.s.HeartbeatNode(b.ctx, n.Incarnation, leaseTTL); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("heartbeat after stop: %v, want store.ErrNotFound", err)
		}
	})

	t.Run("BalanceAndLeavingAreRegistered", func(t *testing.T) {
		b := setup(t, h)
		n := store.NodeInfo{ID: "w", Incarnation: "w/1", Buckets: bucket.Of(0, 1), Balance: true}
		if err := b.s.RegisterNode(b.ctx, n, leaseTTL); err != nil {
			t.Fatal(err)
		}
		old := store.NodeInfo{ID: "old", Incarnation: "old/1", Buckets: bucket.Of(0, 1)}
		if err := b.s.RegisterNode(b.ctx, old, leaseTTL); err != nil {
			t.Fatal(err)
		}
		nodes, err := b.s.ListNodes(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 2 || nodes[0].ID != "old" || nodes[0].Balance || nodes[1].ID != "w" || !nodes[1].Balance ||
			nodes[1].Leaving {
			t.Fatalf("nodes read back as %+v", nodes)
		}
		// The same incarnation registering again says it is leaving.
		n.Leaving = true
		if err := b.s.RegisterNode(b.ctx, n, leaseTTL); err != nil {
			t.Fatal(err)
		}
		nodes, _ = b.s.ListNodes(b.ctx)
		if !nodes[1].Leaving || !nodes[1].Alive || !nodes[1].Balance {
			t.Errorf("a leaving node reads back as %+v", nodes[1])
		}
	})

	t.Run("ALiveIdIsRefused", func(t *testing.T) {
		b := setup(t, h)
		first := store.NodeInfo{ID: "worker-1", Incarnation: "worker-1/aaa", Buckets: bucket.Of(1)}
		if err := b.s.RegisterNode(b.ctx, first, leaseTTL); err != nil {
			t.Fatal(err)
		}
		second := store.NodeInfo{ID: "worker-1", Incarnation: "worker-1/bbb", Buckets: bucket.Of(1)}
		err := b.s.RegisterNode(b.ctx, second, leaseTTL)
		var ae *store.NodeAliveError
		if !errors.As(err, &ae) || !errors.Is(err, store.ErrNodeAlive) {
			t.Fatalf("second live process with the same id: %v, want *store.NodeAliveError", err)
		}
		if ae.NodeID != "worker-1" || ae.Incarnation != "worker-1/aaa" {
			t.Errorf("error names %+v", ae)
		}
		// Once the first has gone quiet, its id may be reused.
		h.ExpireNode(t, b.s, first.Incarnation)
		if err := b.s.RegisterNode(b.ctx, second, leaseTTL); err != nil {
			t.Fatalf("register after the first expired: %v", err)
		}
		nodes, _ := b.s.ListNodes(b.ctx)
		if len(nodes) != 1 || nodes[0].Incarnation != second.Incarnation || !nodes[0].Alive {
			t.Errorf("nodes after replacement: %+v", nodes)
		}
		if err := b.s.HeartbeatNode(b.ctx, first.Incarnation, leaseTTL); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the replaced incarnation's heartbeat: %v, want store.ErrNotFound", err)
		}
	})

	t.Run("AStoppedIdIsReusable", func(t *testing.T) {
		b := setup(t, h)
		first := store.NodeInfo{ID: "w", Incarnation: "w/1", Buckets: bucket.Of(1)}
		_ = b.s.RegisterNode(b.ctx, first, leaseTTL)
		_ = b.s.StopNode(b.ctx, first.Incarnation)
		if err := b.s.RegisterNode(b.ctx, store.NodeInfo{ID: "w", Incarnation: "w/2", Buckets: bucket.Of(1)}, leaseTTL); err != nil {
			t.Errorf("register after a clean stop: %v", err)
		}
	})
}
