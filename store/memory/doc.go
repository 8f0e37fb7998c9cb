// Package memory is a store.Store that keeps everything in process memory,
// for fast unit tests of the packages built on the store: node, commands,
// reconcile and schedule.
//
// It implements the whole contract, with the semantics of the PostgreSQL
// store, behind one mutex: every method is one atomic step, as one statement
// or transaction is in a database. Its "database clock" is a function given
// with [WithClock]; a manual clock (internal/clock.Manual) lets a test
// expire leases by advancing time instead of sleeping. Times are kept in UTC at microsecond precision,
// as PostgreSQL keeps timestamptz, so that a test passes on both stores or on
// neither.
//
// [Store.Handle] opens a second handle on the same data, as a second process
// on one database would have. A few exported methods (ExpireBucketLease,
// ExpireTaskLease, ExpireNode, SetSchemaVersion) exist only for tests: they
// do to the data what a test against PostgreSQL does with a direct UPDATE.
package memory
