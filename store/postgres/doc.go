// Package postgres is flotilla's production store: store.Store and
// store.Notifier on PostgreSQL through pgx/v5. It needs PostgreSQL 13 or
// later and is tested on 15.
//
// # Time
//
// Every lease, run_at and expiry is computed in SQL from
// statement_timestamp(), never from a node's clock. Durations travel as
// microseconds and become intervals in the statement.
//
// # Statements
//
// Each hot-path operation is one statement: a claim keeps the buckets the
// caller holds, picks and locks due tasks with FOR UPDATE SKIP LOCKED, moves
// them to running and writes their audit events in one CTE; a batch of
// completions is one UPDATE ... FROM unnest(...) with its events. A single
// statement runs in its own implicit transaction, so an audit event is
// always committed with the transition it records, and a notification sent
// with pg_notify in it is delivered when it commits.
//
// The statements are written so that their plans do not depend on how
// fresh the statistics are: a table that was empty at the last ANALYZE and
// holds a million queued tasks now is the common case for a job queue.
// Writes about known tasks probe the primary key one row at a time; the
// claim walks its partial index in order (see claimSQL).
//
// The creation event of a task is not stored: TaskEvents derives it (seq 1)
// from the task row, which halves the writes of a bulk insert. Every later
// transition stores one event whose seq is the task's new status_version.
//
// # Documents
//
// Payloads, results and progress are jsonb, so they read back normalised
// (key order and spacing as PostgreSQL writes them). A task created without
// a payload has JSON null; result and progress stay SQL NULL (nil) until an
// attempt records one.
//
// # Schema
//
// Migrations are embedded (migrations/NNNN_*.sql) and applied by Migrate in
// one transaction under an advisory lock, so that two processes migrating at
// once apply them once. SchemaVersion is the version this binary knows; Meta
// refuses a database that is older or newer.
//
// # Connections
//
// New opens a pgxpool.Pool with plan_cache_mode=force_custom_plan (see
// New), an application_name and an optional statement_timeout, and pings
// it, so that an unreachable database fails at once. Bucket leases (acquire,
// renew, release) and node heartbeats use a second pool of LeaseConns
// connections, so that a renewal never waits behind the application's
// queries for a connection of the main pool. Listen uses a dedicated
// connection per subscription, outside both pools.
//
// The main pool holds DefaultMaxConns connections unless WithMaxConns or the
// DSN's pool_max_conns says otherwise. A node warms the store before its
// first claim (Warm): it opens the whole pool, and one lease connection, and
// prepares the hot statements on each; from then on every connection the
// pools open is prepared the same way before it is handed out.
// WithWarmConns(n) warms fewer, and WithWarmConns(0) none. A store no node
// warms (one that only submits, say) opens connections as it needs them and
// prepares only what it runs.
package postgres
