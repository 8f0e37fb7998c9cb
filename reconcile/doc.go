// Package reconcile rescues the tasks of a bucket holder's buckets whose
// attempt is over without having said so: the node running it died, froze
// or lost its bucket (DESIGN §5 invariants 3 and 9, §6).
//
// What it owns: the decision for each such task. A task with attempts left
// goes to retrying, with the caller's backoff; one without goes to lost; a
// task that is stopping, or has a stop pending, ends stopped, because a
// pending stop wins over a retry. Each move writes one audit event naming
// the owner whose attempt was lost, and the rescue returns a Report with
// one Entry per task.
//
// What the database decides: which tasks are expired (their task lease ran
// out by the database clock, or they were claimed under an older epoch of
// their bucket, as after a takeover, when the new holder need not wait out
// the dead holder's task leases); whether the caller still holds the task's
// bucket under the epoch it names (every move carries a store.LeaseGuard,
// so a caller that lost the bucket, or names one it never held, changes
// nothing); whether the task is still as it was read (a compare-and-set on
// its status version); and where a pending stop sends it.
//
// On failure: a task that moved between the listing and the move (a late
// completion landed first) is an Entry with OutcomeConflict, and a bucket
// lost meanwhile an Entry with OutcomeFenced; neither is an error of the
// rescue, and the fenced bucket is left alone for the rest of it. A store
// that cannot be reached ends the rescue with an error and the report of
// what was done so far; the tasks left are still expired, so the next
// rescue finds them again. Nothing is lost by stopping half-way.
//
// RunOperator is the same rescue run from outside the fleet (`worker
// reconcile`), in buckets no live node holds. It takes their leases first,
// renews them every TTL/3 for as long as it works, and stops with
// ErrOperatorLeaseLost when a renewal finds a bucket taken or none is
// answered before its local deadline; it releases them when it ends.
package reconcile
