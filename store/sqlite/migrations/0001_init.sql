-- flotilla schema on SQLite, version 1.
--
-- Applied by Migrate inside one BEGIN IMMEDIATE transaction; never edit a
-- released migration: add the next numbered file instead. Times are
-- INTEGER microseconds since the Unix epoch (UTC), NULL for none; documents
-- are JSON text; booleans are 0 or 1.

-- The fleet's metadata: exactly one row, written by the first Migrate.
CREATE TABLE flotilla_meta (
    singleton   INTEGER PRIMARY KEY CHECK (singleton = 1),
    num_buckets INTEGER NOT NULL CHECK (num_buckets BETWEEN 1 AND 65536),
    created_at  INTEGER NOT NULL
);

CREATE TABLE flotilla_tasks (
    id               INTEGER PRIMARY KEY,
    kind             TEXT    NOT NULL,
    key              TEXT    NOT NULL DEFAULT '',
    bucket           INTEGER NOT NULL CHECK (bucket >= 0),
    status           TEXT    NOT NULL CHECK (status IN (
                         'pending', 'scheduled', 'queued', 'running', 'stopping', 'pausing', 'paused',
                         'retrying', 'succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost',
                         'skipped')),
    status_version   INTEGER NOT NULL DEFAULT 1,
    priority         INTEGER NOT NULL DEFAULT 0,
    run_at           INTEGER NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    timeout_ms       INTEGER NOT NULL DEFAULT 0,
    payload          TEXT    NOT NULL DEFAULT 'null',
    result           TEXT,
    progress         TEXT,
    error            TEXT    NOT NULL DEFAULT '',
    claim_seq        INTEGER NOT NULL DEFAULT 0,
    owner            TEXT,
    node             TEXT    NOT NULL DEFAULT '',
    epoch            INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    stop_requested   INTEGER NOT NULL DEFAULT 0,
    pause_requested  INTEGER NOT NULL DEFAULT 0,
    schedule         TEXT,
    scheduled_for    INTEGER,
    unique_key       TEXT,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    updated_at       INTEGER NOT NULL
);

-- The claim walks this partial index in the claim's order and stops at its
-- limit, with the held buckets and the kinds as a filter, as on PostgreSQL.
CREATE INDEX flotilla_tasks_claim_idx ON flotilla_tasks (priority DESC, run_at, id)
    WHERE status IN ('queued', 'scheduled', 'retrying');

-- Active rows per bucket: reconcile's expired-lease scan, the backlog count.
CREATE INDEX flotilla_tasks_active_idx ON flotilla_tasks (bucket)
    WHERE status IN ('running', 'stopping', 'pausing');

-- One task per schedule tick, fleet-wide.
CREATE UNIQUE INDEX flotilla_tasks_schedule_tick_idx ON flotilla_tasks (schedule, scheduled_for)
    WHERE schedule IS NOT NULL;

-- At most one unfinished task per unique key.
CREATE UNIQUE INDEX flotilla_tasks_unique_key_idx ON flotilla_tasks (unique_key)
    WHERE unique_key IS NOT NULL
      AND status NOT IN ('succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost', 'skipped');

-- The audit trail. The creation event (seq 1) is not stored: it is derived
-- from the task row, as on PostgreSQL.
CREATE TABLE flotilla_task_events (
    task_id     INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    from_status TEXT    NOT NULL,
    to_status   TEXT    NOT NULL,
    at          INTEGER NOT NULL,
    node        TEXT    NOT NULL DEFAULT '',
    epoch       INTEGER NOT NULL DEFAULT 0,
    attempt     INTEGER NOT NULL DEFAULT 0,
    reason      TEXT    NOT NULL DEFAULT '',
    error       TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;

CREATE TABLE flotilla_bucket_leases (
    bucket      INTEGER PRIMARY KEY,
    owner       TEXT,
    node        TEXT,
    epoch       INTEGER NOT NULL DEFAULT 0,
    expires_at  INTEGER,
    acquired_at INTEGER,
    renewed_at  INTEGER
);

CREATE TABLE flotilla_nodes (
    id           TEXT    PRIMARY KEY,
    incarnation  TEXT    NOT NULL,
    buckets      TEXT    NOT NULL DEFAULT '',
    kinds        TEXT    NOT NULL DEFAULT '[]', -- a JSON array of strings
    version      TEXT    NOT NULL DEFAULT '',
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    stopped_at   INTEGER
);

CREATE TABLE flotilla_commands (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id   INTEGER NOT NULL,
    kind      TEXT    NOT NULL,
    reason    TEXT    NOT NULL DEFAULT '',
    issued_by TEXT    NOT NULL DEFAULT '',
    issued_at INTEGER NOT NULL,
    owner     TEXT,
    acked_at  INTEGER,
    acked_by  TEXT    NOT NULL DEFAULT '',
    outcome   TEXT    NOT NULL DEFAULT ''
);

CREATE INDEX flotilla_commands_pending_idx ON flotilla_commands (task_id) WHERE acked_at IS NULL;

CREATE TABLE flotilla_schedules (
    name         TEXT    PRIMARY KEY,
    spec         TEXT    NOT NULL,
    timezone     TEXT    NOT NULL DEFAULT '',
    catch_up     TEXT    NOT NULL DEFAULT '',
    kind         TEXT    NOT NULL,
    key          TEXT    NOT NULL DEFAULT '',
    bucket       INTEGER NOT NULL CHECK (bucket >= 0),
    payload      TEXT    NOT NULL DEFAULT 'null',
    priority     INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 0,
    timeout_ms   INTEGER NOT NULL DEFAULT 0,
    enabled      INTEGER NOT NULL DEFAULT 1,
    next_fire_at INTEGER NOT NULL,
    last_fire_at INTEGER,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);

CREATE INDEX flotilla_schedules_due_idx ON flotilla_schedules (bucket, next_fire_at) WHERE enabled;

-- The outbox of notifications for other processes on the same file: every
-- write that announces something adds a row in its own transaction, so the
-- row appears when the change commits. Listeners poll for ids above the
-- last one they saw; the writer prunes rows older than outboxRetention.
-- AUTOINCREMENT so that an id is never handed out twice, even after every
-- row has been pruned: a listener's "above the last seen" must stay true.
CREATE TABLE flotilla_notifications (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    topic   TEXT    NOT NULL,
    payload TEXT    NOT NULL,
    origin  TEXT    NOT NULL, -- the writing handle, which delivers to its own listeners directly
    at      INTEGER NOT NULL
);
