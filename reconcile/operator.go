package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/store"
)

// DefaultOperatorTTL is the TTL of the leases an operator's run takes; the
// run renews them every third of it for as long as it works.
const DefaultOperatorTTL = 30 * time.Second

// DefaultOperatorRetryBusy is how long an operator's run tries again the
// tasks answered busy (OperatorRequest.RetryBusyFor): a one-off run has no
// next pass to leave them to, and on SQLite any write of a live node in
// the same file answers busy for as long as it takes.
const DefaultOperatorRetryBusy = 5 * time.Second

// ErrOperatorLeaseLost ends an operator's run whose leases could no longer
// be trusted: a renewal found a bucket taken by a node, or none was answered
// before the leases would have expired.
var ErrOperatorLeaseLost = errors.New("the run lost the leases of the buckets it was rescuing")

// OperatorRequest asks for a rescue run from outside the fleet, by an
// operator: in the given buckets, but only in those no live node holds.
type OperatorRequest struct {
	// Owner and Node name the operator's run (an incarnation of its own,
	// so that its leases are told apart from every node's).
	Owner, Node string
	// Buckets to look at; the fleet's every bucket when empty.
	Buckets bucket.Set
	// TTL of the leases the run takes while it acts (default
	// DefaultOperatorTTL). The run renews them every TTL/3 until it ends,
	// however long the rescue takes.
	TTL time.Duration
	// Backoff before a retry, as in Request.
	Backoff func(attempt int) time.Duration
	// RetryBusyFor is the run's budget for trying busy tasks again, as in
	// Request (default DefaultOperatorRetryBusy; negative tries each once).
	RetryBusyFor time.Duration
	// DryRun takes no lease and moves nothing: it reports what a real run
	// would do now.
	DryRun bool
	// Clock times the renewals and the leases' local deadline (default
	// clock.Real). The leases' expiry is the store's clock.
	Clock clock.Clock
}

// OperatorReport is the outcome of an operator's run.
type OperatorReport struct {
	Report
	// Acted lists the buckets the run held while it acted (or, for a dry
	// run, would have).
	Acted bucket.Set
	// Skipped maps each bucket left alone to the node holding it: a live
	// holder rescues its own buckets.
	Skipped map[int]string
}

// RunOperator rescues the expired tasks of the requested buckets that no
// live node holds. It takes their leases first (so the epoch goes up by one
// and every attempt claimed before is fenced), rescues, and releases them;
// a bucket a node takes meanwhile is skipped, as one held from the start is.
// A dry run reads the current epochs and reports as if it held each free
// bucket under the next one. A task answered busy is tried again for up to
// RetryBusyFor (5 s by default) over the whole run before it is reported
// busy.
//
// The leases are renewed every TTL/3 while the run works. When a renewal
// finds a bucket taken by someone else, or none has been answered by the
// local deadline (the start of the last answered renewal + TTL − margin,
// margin max(250ms, TTL/10)), the run stops at once and returns
// ErrOperatorLeaseLost with the report so far: its moves would be fenced
// anyway, since each one is conditional on the lease.
func RunOperator(ctx context.Context, s store.Store, req OperatorRequest) (OperatorReport, error) {
	out := OperatorReport{}
	retryBusy := req.RetryBusyFor
	switch {
	case retryBusy == 0:
		retryBusy = DefaultOperatorRetryBusy
	case retryBusy < 0:
		retryBusy = 0
	}
	var err error
	out.Acted, out.Skipped, err = HoldUnheld(ctx, s, UnheldRequest{Owner: req.Owner, Node: req.Node,
		Buckets: req.Buckets, TTL: req.TTL, DryRun: req.DryRun, Clock: req.Clock},
		func(ctx context.Context, held []store.HeldBucket) error {
			var err error
			out.Report, err = Rescue(ctx, s, Request{Owner: req.Owner, Node: req.Node, Buckets: held,
				Backoff: req.Backoff, DryRun: req.DryRun, RetryBusyFor: retryBusy})
			return err
		})
	return out, err
}

// UnheldRequest names the buckets an operator's run acts on, and how it
// holds them: the fields of OperatorRequest that are not about rescuing.
type UnheldRequest struct {
	Owner, Node string
	Buckets     bucket.Set // every bucket when empty
	TTL         time.Duration
	DryRun      bool
	Clock       clock.Clock
}

// HoldUnheld runs act on the requested buckets that no live node holds,
// holding their leases meanwhile, as RunOperator does for a rescue: it takes
// the leases (the epoch goes up, fencing whatever was done before), renews
// them every TTL/3 while act runs, cancels act's context when they can no
// longer be trusted (and then returns ErrOperatorLeaseLost), and releases
// them at the end. A bucket held from the start, or taken by a node
// meanwhile, is skipped: skipped maps it to its holder's node. A dry run
// takes no lease and hands act each free bucket under the epoch a run would
// take it at. act is not called when no bucket is free.
func HoldUnheld(ctx context.Context, s store.Store, req UnheldRequest,
	act func(ctx context.Context, held []store.HeldBucket) error) (acted bucket.Set, skipped map[int]string, err error) {
	skipped = map[int]string{}
	leases, err := s.ListBuckets(ctx)
	if err != nil {
		return acted, skipped, err
	}
	wanted := req.Buckets
	if wanted.Empty() {
		wanted = bucket.All(len(leases))
	}
	if err := wanted.CheckRange(len(leases)); err != nil {
		return acted, skipped, err
	}
	var free []int
	epochs := map[int]int64{}
	for _, l := range leases {
		if !wanted.Contains(l.Bucket) {
			continue
		}
		if l.Holder != "" {
			skipped[l.Bucket] = l.Node
			continue
		}
		free = append(free, l.Bucket)
		epochs[l.Bucket] = l.Epoch
	}
	if len(free) == 0 {
		return bucket.Set{}, skipped, nil
	}

	var held []store.HeldBucket
	if req.DryRun {
		for _, b := range free {
			held = append(held, store.HeldBucket{Bucket: b, Epoch: epochs[b] + 1})
		}
	} else {
		ttl := req.TTL
		if ttl <= 0 {
			ttl = DefaultOperatorTTL
		}
		clk := req.Clock
		if clk == nil {
			clk = clock.Real{}
		}
		sent := clk.Now()
		got, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: req.Owner, Node: req.Node,
			Buckets: bucket.Of(free...), TTL: ttl})
		if err != nil {
			return acted, skipped, fmt.Errorf("taking the leases of buckets nobody holds: %w", err)
		}
		for _, l := range got {
			if l.Held {
				held = append(held, store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch})
			} else {
				skipped[l.Bucket] = l.Node // a node took it meanwhile
			}
		}
		// Give the leases back however the run ends, even if ctx has;
		// expiry is the backstop.
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_, _ = s.ReleaseBuckets(rctx, req.Owner, bucket.Set{})
		}()
		if len(held) > 0 {
			buckets := make([]int, len(held))
			for i, h := range held {
				buckets[i] = h.Bucket
			}
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(ctx)
			k := &leaseKeeper{s: s, clock: clk, ttl: ttl, cancel: cancel, req: store.AcquireRequest{
				Owner: req.Owner, Node: req.Node, Buckets: bucket.Of(buckets...), TTL: ttl}}
			k.start(ctx, sent)
			defer func() {
				k.stop()
				cancel(nil)
			}()
		}
	}
	nums := make([]int, len(held))
	for i, h := range held {
		nums[i] = h.Bucket
	}
	acted = bucket.Of(nums...)
	if len(held) == 0 {
		return acted, skipped, nil
	}
	err = act(ctx, held)
	if cause := context.Cause(ctx); errors.Is(cause, ErrOperatorLeaseLost) {
		return acted, skipped, cause
	}
	return acted, skipped, err
}

// leaseKeeper renews an operator run's leases every TTL/3 and cancels the
// run's context, with a cause wrapping ErrOperatorLeaseLost, when they can
// no longer be trusted. Its deadline is a timer of its own, so a renewal
// that hangs cannot hold it back.
type leaseKeeper struct {
	s      store.Store
	clock  clock.Clock
	ttl    time.Duration
	req    store.AcquireRequest
	cancel context.CancelCauseFunc

	tick chan struct{}
	quit chan struct{}
	done chan struct{}

	deadline clock.Timer // owned by run once started; by stop after
}

// start arms the deadline from sent, when the acquisition was sent, and
// the first renewal.
func (k *leaseKeeper) start(ctx context.Context, sent time.Time) {
	k.tick = make(chan struct{}, 1)
	k.quit = make(chan struct{})
	k.done = make(chan struct{})
	k.armDeadline(sent)
	next := k.clock.AfterFunc(k.every(), k.fire)
	go k.run(ctx, next)
}

// stop ends the renewals and waits for the last one to return.
func (k *leaseKeeper) stop() {
	close(k.quit)
	<-k.done
	k.deadline.Stop()
}

func (k *leaseKeeper) every() time.Duration { return k.ttl / 3 }

// fire wakes run; a tick that finds one waiting is dropped.
func (k *leaseKeeper) fire() {
	select {
	case k.tick <- struct{}{}:
	default:
	}
}

func (k *leaseKeeper) armDeadline(sent time.Time) {
	if k.deadline != nil {
		k.deadline.Stop()
	}
	margin := max(250*time.Millisecond, k.ttl/10)
	left := sent.Add(k.ttl - margin).Sub(k.clock.Now())
	k.deadline = k.clock.AfterFunc(left, func() {
		k.cancel(fmt.Errorf("%w: no renewal was answered within %v", ErrOperatorLeaseLost, k.ttl-margin))
	})
}

func (k *leaseKeeper) run(ctx context.Context, next clock.Timer) {
	defer close(k.done)
	defer func() { next.Stop() }()
	for {
		select {
		case <-k.quit:
			return
		case <-ctx.Done():
			return
		case <-k.tick:
		}
		// The next renewal is timed from this one's start, not its end,
		// so a slow answer does not stretch the interval.
		next = k.clock.AfterFunc(k.every(), k.fire)
		sent := k.clock.Now()
		rctx, cancel := context.WithTimeout(ctx, k.every())
		leases, err := k.s.AcquireBuckets(rctx, k.req)
		cancel()
		if err != nil {
			continue // not a lost lease: the deadline decides
		}
		for _, l := range leases {
			switch {
			case !l.Held:
				k.cancel(fmt.Errorf("%w: bucket %d is held by %s now", ErrOperatorLeaseLost, l.Bucket, l.Node))
				return
			case l.Acquired:
				// Taken anew under a new epoch: the lease had expired, and
				// the run's moves carry the old one.
				k.cancel(fmt.Errorf("%w: the lease of bucket %d had expired", ErrOperatorLeaseLost, l.Bucket))
				return
			}
		}
		k.armDeadline(sent)
	}
}
