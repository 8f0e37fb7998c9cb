package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/reconcile"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Request asks for a prune run from outside the fleet.
type Request struct {
	// Owner and Node name the run: an incarnation of its own, so that its
	// leases are told apart from every node's.
	Owner, Node string
	// Buckets to prune; every bucket of the fleet when empty. Buckets a
	// live node holds are skipped.
	Buckets bucket.Set
	// Retention as the store applies it (see store.Retention.WithDefaults).
	Retention store.Retention
	// Batch is the most tasks one statement removes (store.DefaultPruneBatch).
	Batch int
	// DryRun takes no lease and removes nothing: it counts what a run
	// would remove now.
	DryRun bool
	// TTL and Clock of the leases the run holds, as in
	// reconcile.OperatorRequest.
	TTL   time.Duration
	Clock clock.Clock
}

// Report is the outcome of a run.
type Report struct {
	DryRun bool
	// Acted lists the buckets the run held (or, dry, would have).
	Acted bucket.Set
	// Skipped maps each bucket left alone to the node holding it.
	Skipped map[int]string
	// Buckets has one entry per bucket with something pruned (or
	// prunable), ascending.
	Buckets []BucketReport
	// Total adds the buckets up.
	Total store.PruneResult
}

// BucketReport is what went from one bucket.
type BucketReport struct {
	Bucket int
	Epoch  int64 // the run's epoch there (dry: the one it would take)
	store.PruneResult
}

// Prune removes, from the requested buckets that no live node holds, the
// finished tasks past their retention, in batches, holding the buckets'
// leases while it works (reconcile.HoldUnheld). A bucket a node takes
// meanwhile is fenced: the run moves to the next and lists it as skipped.
func Prune(ctx context.Context, s store.Store, req Request) (Report, error) {
	out := Report{DryRun: req.DryRun}
	if err := req.Retention.Check(); err != nil {
		return out, err
	}
	var err error
	out.Acted, out.Skipped, err = reconcile.HoldUnheld(ctx, s, reconcile.UnheldRequest{Owner: req.Owner, Node: req.Node,
		Buckets: req.Buckets, TTL: req.TTL, DryRun: req.DryRun, Clock: req.Clock},
		func(ctx context.Context, held []store.HeldBucket) error {
			for _, h := range held {
				res, err := pruneBucket(ctx, s, req, h)
				if res.Tasks > 0 {
					out.Buckets = append(out.Buckets, BucketReport{Bucket: h.Bucket, Epoch: h.Epoch, PruneResult: res})
					for _, st := range task.TerminalStates() {
						if c, ok := res.ByStatus[st]; ok {
							out.Total.AddMany(st, c.Tasks, c.Oldest)
						}
					}
					out.Total.Events += res.Events
					out.Total.Commands += res.Commands
				}
				switch {
				case errors.Is(err, store.ErrFenced):
					out.Skipped[h.Bucket] = "a node that took it during the run"
				case err != nil:
					return fmt.Errorf("bucket %d: %w", h.Bucket, err)
				}
			}
			return nil
		})
	slices.SortFunc(out.Buckets, func(a, b BucketReport) int { return a.Bucket - b.Bucket })
	return out, err
}

// pruneBucket prunes one held bucket until a batch comes back short.
func pruneBucket(ctx context.Context, s store.Store, req Request, h store.HeldBucket) (store.PruneResult, error) {
	pr := store.PruneRequest{Owner: req.Owner, Bucket: h.Bucket, Epoch: h.Epoch, Retention: req.Retention,
		Limit: req.Batch, DryRun: req.DryRun}
	if pr.Limit == 0 {
		pr.Limit = store.DefaultPruneBatch
	}
	if req.DryRun {
		return s.PruneFinished(ctx, pr)
	}
	var total store.PruneResult
	for {
		res, err := s.PruneFinished(ctx, pr)
		if err != nil {
			return total, err
		}
		for st, c := range res.ByStatus {
			total.AddMany(st, c.Tasks, c.Oldest)
		}
		total.Events += res.Events
		total.Commands += res.Commands
		if res.Tasks < pr.Limit {
			return total, nil
		}
	}
}
