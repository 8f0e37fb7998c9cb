// Package benchmark measures a flotilla fleet, on PostgreSQL or SQLite, with the
// workloads users compare job systems on: a bulk insert, the burn-down of a
// backlog of no-op tasks, the time from a single insert to the start of its
// handler (at a fixed rate, and on an idle node), and the time from a stop
// to the cancellation of a running handler's context.
//
// `worker bench` runs Run against the fleet at --dsn; the bench/ module runs
// the same workloads side by side with River. Every workload runs against a
// store the caller opened and migrated; workloads that need a node start one
// in this process, holding every bucket, and shut it down before they
// return. Nothing here prints: progress goes to a callback and results are
// returned, for the caller to show.
//
// The burn-down is measured as River's harness measures it: the backlog is
// inserted and analyzed before the clock starts, and the clock runs from the
// node's start to the last recorded completion.
package benchmark

import "github.com/flotilla-dev/flotilla/store"

// Store is what the workloads run on: a store with notifications, as both
// the PostgreSQL and the SQLite store are, so that nodes hear of new tasks
// as they would in production.
type Store interface {
	store.Store
	store.Notifier
}
