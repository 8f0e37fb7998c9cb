// Package sqlite is flotilla's embedded store: store.Store and
// store.Notifier on one SQLite file, through modernc.org/sqlite (pure Go,
// no cgo). It is the default store: several worker processes on one machine
// share one file, with the same buckets, leases, epochs, fencing, audit
// trail, commands and schedules as on PostgreSQL.
//
// # Time
//
// The database clock is SQLite's own: every operation reads
// unixepoch('subsec') in a statement of its transaction (SQLite's clock has
// millisecond resolution) and decides leases and due times from it. Times
// are kept as integer microseconds since the Unix epoch.
//
// # Writes
//
// The file is in WAL mode, so readers never wait for the writer. Each
// process has one writer connection, driven by one goroutine: every write
// is an op sent to it, and the ops waiting together run in one BEGIN
// IMMEDIATE transaction, each under a savepoint of its own (group commit:
// one commit and one WAL sync for the batch, one op's failure undoes that
// op alone). A deferred transaction that upgrades to a write lock gets
// SQLITE_BUSY at once whatever the busy timeout says; IMMEDIATE takes the
// lock at BEGIN and waits for it there. Within an op the rules are written
// in Go over the rows read under the write lock, which no other connection
// can change until the commit; they are the same rules as the other
// stores' (destination, fencing, commands answered by the move).
//
// The busy timeout (DefaultBusyTimeout) is a backstop for writers of other
// processes on the same file: a write that cannot get the lock in time
// fails with store.ErrBusy, a renewal answers every attempt busy, and a
// node whose writes keep failing past its local lease deadline behaves as a
// partitioned node does: it stops claiming, and its late writes are fenced.
//
// # Reads
//
// Reads use a separate pool of query_only connections, each reading the
// last committed state.
//
// # Notifications
//
// A write that announces something (new tasks, a command, released
// buckets) adds a row to flotilla_notifications in its own transaction.
// This handle's listeners get the notification from the writer when the
// batch commits; listeners of other processes read the outbox every
// DefaultOutboxPoll, and the writer prunes rows older than ten seconds.
// Notifications are hints: the claim loop polls anyway.
//
// # What SQLite does not do
//
// A row cannot be locked alone: a write locks the file, and an operator's
// open write transaction stops every writer until it ends. The fleet must
// live on one machine (SQLite's locks need a local file system, not NFS).
// Writes do not scale past one core's worth of transactions.
//
// # Schema
//
// Migrations are embedded (migrations/NNNN_*.sql) and applied by Migrate in
// one write transaction, so that two processes migrating at once apply
// them once. SchemaVersion is the version this binary knows; Meta refuses a
// file that is older or newer.
package sqlite
