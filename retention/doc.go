// Package retention is the operator's side of pruning finished history:
// `worker prune` removes the finished tasks that have outlived their
// retention from the buckets no live node holds (a live holder prunes its
// own, in its retention loop), or, dry, counts what would go.
//
// What may go is the store's to decide (store.Store.PruneFinished), under
// the bucket's lease: the run takes the leases of the buckets nobody holds
// (reconcile.HoldUnheld), so the epoch goes up and a former holder's
// pruning is fenced, prunes them a batch at a time, and releases them. A
// node that takes a bucket meanwhile fences the run's next batch there; the
// run reports the bucket and goes on with the others.
package retention
