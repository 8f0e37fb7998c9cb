package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// OperatorRequest asks for a rescue run from outside the fleet, by an
// operator: in the given buckets, but only in those no live node holds.
type OperatorRequest struct {
	// Owner and Node name the operator's run (an incarnation of its own,
	// so that its leases are told apart from every node's).
	Owner, Node string
	// Buckets to look at; the fleet's every bucket when empty.
	Buckets bucket.Set
	// TTL of the leases the run takes while it acts (default 30s).
	TTL time.Duration
	// Backoff before a retry, as in Request.
	Backoff func(attempt int) time.Duration
	// DryRun takes no lease and moves nothing: it reports what a real run
	// would do now.
	DryRun bool
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
// bucket under the next one.
func RunOperator(ctx context.Context, s store.Store, req OperatorRequest) (OperatorReport, error) {
	out := OperatorReport{Skipped: map[int]string{}}
	leases, err := s.ListBuckets(ctx)
	if err != nil {
		return out, err
	}
	wanted := req.Buckets
	if wanted.Empty() {
		wanted = bucket.All(len(leases))
	}
	if err := wanted.CheckRange(len(leases)); err != nil {
		return out, err
	}
	var free []int
	epochs := map[int]int64{}
	for _, l := range leases {
		if !wanted.Contains(l.Bucket) {
			continue
		}
		if l.Holder != "" {
			out.Skipped[l.Bucket] = l.Node
			continue
		}
		free = append(free, l.Bucket)
		epochs[l.Bucket] = l.Epoch
	}
	if len(free) == 0 {
		out.Acted = bucket.Set{}
		return out, nil
	}

	var held []store.HeldBucket
	if req.DryRun {
		for _, b := range free {
			held = append(held, store.HeldBucket{Bucket: b, Epoch: epochs[b] + 1})
		}
	} else {
		ttl := req.TTL
		if ttl <= 0 {
			ttl = 30 * time.Second
		}
		got, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: req.Owner, Node: req.Node,
			Buckets: bucket.Of(free...), TTL: ttl})
		if err != nil {
			return out, fmt.Errorf("taking the leases of buckets nobody holds: %w", err)
		}
		for _, l := range got {
			if l.Held {
				held = append(held, store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch})
			} else {
				out.Skipped[l.Bucket] = l.Node // a node took it meanwhile
			}
		}
		// Give the leases back however the rescue ends, even if ctx has;
		// expiry is the backstop.
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_, _ = s.ReleaseBuckets(rctx, req.Owner, bucket.Set{})
		}()
	}
	acted := make([]int, len(held))
	for i, h := range held {
		acted[i] = h.Bucket
	}
	out.Acted = bucket.Of(acted...)
	if len(held) == 0 {
		return out, nil
	}
	out.Report, err = Rescue(ctx, s, Request{Owner: req.Owner, Node: req.Node, Buckets: held,
		Backoff: req.Backoff, DryRun: req.DryRun})
	return out, err
}
