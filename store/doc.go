// Package store is flotilla's storage contract: the Store interface, the
// request and result types it speaks, and the errors it returns.
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
