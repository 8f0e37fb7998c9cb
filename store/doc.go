// Package store is flotilla's storage contract: the Store interface, the
// request and result types it speaks, and the errors it returns.
//
// A program rarely calls a Store itself: flotilla.Connect opens one from a
// DSN (package dsn) and node.New runs on client.Store(). What it uses of
// this package are the errors to match, the filters and the limits:
//
//	_, err := flotilla.SubmitArgs(ctx, client, args, flotilla.WithUniqueKey("invoice-7"))
//	if errors.Is(err, store.ErrDuplicate) { ... }      // an unfinished task has the key
//	tasks, err := client.List(ctx, store.TaskFilter{Kind: "email", Statuses: []task.Status{task.Failed}})
//	cfg := node.Config{Limits: []store.Limit{{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 2}}}
//
// # How it works
//
// The database decides ownership. Every lease decision uses the database's
// clock, never a node's; every write about an active task (running, stopping,
// pausing) is conditional on the task id, its claim_seq and the owner's
// incarnation, and on the bucket lease still being held under the epoch the
// task was claimed with; every transition is a compare-and-set that writes
// its audit event in the same transaction.
//
// Implementations: store/postgres (production), store/memory (unit tests of
// other packages). store/storetest holds the one contract suite that every
// implementation runs; a behaviour added to one store is added to the suite
// first.
package store
