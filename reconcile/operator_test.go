package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func TestTheOperatorActsOnlyWhereNobodyHolds(t *testing.T) {
	b := setup(t)
	// A dead node left a running task in bucket 1; a live node holds
	// bucket 2 and runs a task there.
	deadHeld := b.hold(t, "dead/1", 1)
	orphan := b.running(t, "dead/1", deadHeld, 1, 3)
	b.store.ExpireBucketLease(1)
	liveHeld := b.hold(t, "live/1", 2)
	busy := b.running(t, "live/1", liveHeld, 2, 3)

	req := OperatorRequest{Owner: "ops/1", Node: "ops", Buckets: bucket.Of(1, 2)}

	dry := req
	dry.DryRun = true
	planned, err := RunOperator(b.ctx, b.store, dry)
	if err != nil {
		t.Fatal(err)
	}
	if planned.Skipped[2] != "live" || !planned.Acted.Equal(bucket.Of(1)) || planned.Retried != 1 {
		t.Fatalf("dry run: acted %s, skipped %v, retried %d; want bucket 1 only, 2 skipped for live", planned.Acted, planned.Skipped, planned.Retried)
	}
	if got := b.get(t, orphan.ID); got.Status != task.Running {
		t.Fatalf("a dry run moved task %d to %s", orphan.ID, got.Status)
	}
	if leases, _ := b.store.ListBuckets(b.ctx); leases[1].Holder != "" || leases[1].Epoch != deadHeld[0].Epoch {
		t.Fatalf("a dry run touched bucket 1's lease: %+v", leases[1])
	}

	done, err := RunOperator(b.ctx, b.store, req)
	if err != nil {
		t.Fatal(err)
	}
	if done.Retried != 1 || len(done.Entries) != 1 || done.Entries[0].TaskID != orphan.ID || done.Skipped[2] != "live" {
		t.Fatalf("real run: %+v", done)
	}
	if got := b.get(t, orphan.ID); got.Status != task.Retrying {
		t.Errorf("orphan is %s, want retrying", got.Status)
	}
	if got := b.get(t, busy.ID); got.Status != task.Running || got.Owner != "live/1" {
		t.Errorf("the live node's task was touched: %s owned by %q", got.Status, got.Owner)
	}
	leases, _ := b.store.ListBuckets(b.ctx)
	if leases[1].Holder != "" || leases[1].Epoch != deadHeld[0].Epoch+1 {
		t.Errorf("bucket 1 after the run: %+v, want released at epoch %d", leases[1], deadHeld[0].Epoch+1)
	}
	if leases[2].Holder != "live/1" {
		t.Errorf("bucket 2's holder changed: %+v", leases[2])
	}
}

func TestTheOperatorRefusesBucketsOutsideTheFleet(t *testing.T) {
	b := setup(t)
	_, err := RunOperator(b.ctx, b.store, OperatorRequest{Owner: "ops/1", Node: "ops", Buckets: bucket.Of(testBuckets + 1)})
	if err == nil {
		t.Fatal("a bucket beyond the fleet was accepted")
	}
	if !errors.Is(err, bucket.ErrInvalidSet) {
		t.Errorf("error %v, want bucket.ErrInvalidSet", err)
	}
}

// An operator's run has no later pass: it tries a busy task again (for up
// to DefaultOperatorRetryBusy) rather than report it busy at once, unless
// told to try each once.
func TestTheOperatorTriesABusyTaskAgain(t *testing.T) {
	for _, c := range []struct {
		name      string
		retryBusy time.Duration
		want      Outcome
		moves     int
	}{
		{name: "by default", want: OutcomeRetried, moves: 3},
		{name: "not when told to try once", retryBusy: -1, want: OutcomeBusy, moves: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := setup(t)
			deadHeld := b.hold(t, "dead/1", 1)
			orphan := b.running(t, "dead/1", deadHeld, 1, 3)
			b.store.ExpireBucketLease(1)
			hooked := &hookedStore{Store: b.store, failMove: func(n int) error {
				if n <= 2 {
					return fmt.Errorf("%w (database is locked)", store.ErrBusy)
				}
				return nil
			}}
			rep, err := RunOperator(b.ctx, hooked, OperatorRequest{Owner: "ops/1", Node: "ops", Buckets: bucket.Of(1),
				RetryBusyFor: c.retryBusy})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Entries) != 1 || rep.Entries[0].TaskID != orphan.ID || rep.Entries[0].Outcome != c.want || hooked.moves != c.moves {
				t.Fatalf("report %+v after %d moves asked, want %s after %d", rep.Report, hooked.moves, c.want, c.moves)
			}
		})
	}
}

// gatedStore holds the first ExpiredTasks until released, as a rescue
// that takes long (a slow database, many tasks) would.
type gatedStore struct {
	store.Store
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) ExpiredTasks(ctx context.Context, held []store.HeldBucket, limit int) ([]*task.Task, error) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Store.ExpiredTasks(ctx, held, limit)
}

type operatorResult struct {
	rep OperatorReport
	err error
}

// startOperator runs RunOperator on bucket 1 through a gated store and
// returns once the rescue is held at its first listing.
func (b *testBundle) startOperator(t *testing.T, ttl time.Duration) (*gatedStore, <-chan operatorResult) {
	t.Helper()
	gate := &gatedStore{Store: b.store, entered: make(chan struct{}), release: make(chan struct{})}
	done := make(chan operatorResult, 1)
	go func() {
		rep, err := RunOperator(b.ctx, gate, OperatorRequest{Owner: "ops/1", Node: "ops", Buckets: bucket.Of(1),
			TTL: ttl, Clock: b.clock})
		done <- operatorResult{rep, err}
	}()
	select {
	case <-gate.entered:
	case r := <-done:
		t.Fatalf("the run ended before it listed the expired tasks: %+v, %v", r.rep, r.err)
	}
	return gate, done
}

func TestTheOperatorRenewsItsLeasesWhileItWorks(t *testing.T) {
	b := setup(t)
	deadHeld := b.hold(t, "dead/1", 1)
	orphan := b.running(t, "dead/1", deadHeld, 1, 3)
	if err := b.store.ExpireBucketLease(1); err != nil {
		t.Fatal(err)
	}
	const ttl = 30 * time.Second
	gate, done := b.startOperator(t, ttl)

	// The rescue outlasts its leases' TTL; each third of it, a renewal
	// moves the expiry on.
	for range 4 {
		b.clock.Advance(ttl / 3)
		want := b.clock.Now().Add(ttl)
		deadline := time.Now().Add(patience.Scale(30 * time.Second))
		for {
			leases, err := b.store.ListBuckets(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if l := leases[1]; l.Holder == "ops/1" && l.ExpiresAt.Equal(want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("bucket 1's lease after %v: %+v, want ops/1 holding it until %v", ttl/3, leases[1], want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	close(gate.release)
	var r operatorResult
	select {
	case r = <-done:
	case <-time.After(patience.Scale(30 * time.Second)):
		t.Fatal("the run did not end within 30s of its rescue being released")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.rep.Retried != 1 || len(r.rep.Entries) != 1 || r.rep.Entries[0].Outcome == OutcomeFenced {
		t.Fatalf("a run that outlasted its TTL: %+v, want task %d retried, not fenced", r.rep, orphan.ID)
	}
	if got := b.get(t, orphan.ID); got.Status != task.Retrying {
		t.Errorf("orphan is %s, want retrying", got.Status)
	}
	if leases, _ := b.store.ListBuckets(b.ctx); leases[1].Holder != "" {
		t.Errorf("bucket 1 after the run: %+v, want released", leases[1])
	}
}

func TestTheOperatorStopsWhenItsLeasesCannotBeTrusted(t *testing.T) {
	const ttl = 30 * time.Second
	for name, lose := range map[string]func(b *testBundle, t *testing.T){
		// A node took the bucket: the renewal is answered "held by node".
		"taken by a node": func(b *testBundle, t *testing.T) {
			if err := b.store.ExpireBucketLease(1); err != nil {
				t.Fatal(err)
			}
			b.hold(t, "node/1", 1)
			b.clock.Advance(ttl / 3)
		},
		// The lease expired and the renewal took it anew, under an epoch
		// the run's moves do not carry.
		"expired meanwhile": func(b *testBundle, t *testing.T) {
			if err := b.store.ExpireBucketLease(1); err != nil {
				t.Fatal(err)
			}
			b.clock.Advance(ttl / 3)
		},
		// No renewal is answered before the local deadline: the store
		// answers, but the clock jumps past the deadline before the
		// first renewal is due.
		"deadline passed": func(b *testBundle, t *testing.T) {
			b.clock.Advance(ttl)
		},
	} {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			deadHeld := b.hold(t, "dead/1", 1)
			orphan := b.running(t, "dead/1", deadHeld, 1, 3)
			if err := b.store.ExpireBucketLease(1); err != nil {
				t.Fatal(err)
			}
			_, done := b.startOperator(t, ttl)
			lose(b, t)
			// The gate stays closed: only the lost lease ends the run.
			var r operatorResult
			select {
			case r = <-done:
			case <-time.After(patience.Scale(30 * time.Second)):
				t.Fatal("the run went on for 30s after its lease was lost")
			}
			if !errors.Is(r.err, ErrOperatorLeaseLost) {
				t.Fatalf("RunOperator = %+v, %v; want ErrOperatorLeaseLost", r.rep, r.err)
			}
			if got := b.get(t, orphan.ID); got.Status != task.Running {
				t.Errorf("orphan is %s, want it left running for the bucket's holder", got.Status)
			}
		})
	}
}
