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
// Every caller hears the truth about its write. An op whose caller gives
// up (its context ends) before the op has run to its end is undone, back to
// its savepoint, so that a caller told "context deadline exceeded" wrote
// nothing: a claim given up on never leaves a task running for nobody. An
// op that has run to its end is sealed, and its caller waits for the
// batch's commit, however late, and hears how it went. When SQLite rolls
// the whole transaction back itself (a full disk, an I/O error, an
// interrupted write), every op sealed in it is told that it failed, and the
// ops not yet run go on in a transaction of their own; a commit hook
// refuses any commit but the writer's own, so that no statement run after
// such a rollback commits alone. The statements that end an op or a batch
// run on no deadline: a batch that outlived its time still ends, and never
// leaves the connection inside a transaction holding the file's lock.
//
// The busy timeout (DefaultBusyTimeout) is a backstop for writers of other
// processes on the same file: a write that cannot get the lock in time
// fails with store.ErrBusy, a renewal answers every attempt busy, and a
// node whose writes keep failing past its local lease deadline behaves as a
// partitioned node does: it stops claiming, and its late writes are fenced.
// The writer waits for the lock a slice (50 ms) at a time, and after the
// first answers store.ErrBusy to the ops that may not wait (a Transition
// with NoWait, reconcile's): every writer takes the file's one lock, so
// they wait that moment, which an ordinary write of another process takes
// well within, and never stall behind a lock held longer (an operator's
// open transaction, a frozen process), as on PostgreSQL they never wait for
// a locked row.
//
// # Reads
//
// Reads use a separate pool of query_only connections, each reading the
// last committed state. A handle opened ReadOnly has that pool alone: it
// opens the file read-only (mode=ro), never creates it, sets nothing on it,
// and reads a file this user may only read; see ReadOnly.
//
// # Files
//
// The path named is the file opened: it is escaped for SQLite's URI, which
// would decode %XX. The store creates the file readable by its owner alone
// (FileMode, 0600), and SQLite gives the -wal and -shm files the database
// file's mode; ReadableByOthers names the files of an older database that
// other users may read.
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
