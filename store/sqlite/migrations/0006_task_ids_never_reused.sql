-- Task ids are never handed out twice, as on PostgreSQL (an identity) and
-- in the memory store.
--
-- The task table's id was a plain INTEGER PRIMARY KEY, which SQLite hands
-- out as one more than the largest id in the table: once retention removed
-- the newest tasks, the next submit took their ids again (and an idle fleet
-- whose tasks were all removed started again at 1), so that an id a user or
-- an application had kept named another task. AUTOINCREMENT keeps the
-- largest id ever handed out in sqlite_sequence and never goes below it.
--
-- SQLite cannot add AUTOINCREMENT to a table: the table is rebuilt, every
-- row copied with its id, column for column in the order the columns have
-- now, and its indexes made again as they were. The sequence starts above
-- the largest task id the file still knows of: the tasks, and the events,
-- commands and dependencies that name one. Ids removed before this
-- migration, above all of those, are not known to the file and may be
-- handed out once more; none is after it.
CREATE TABLE flotilla_tasks_new (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
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
    updated_at       INTEGER NOT NULL,
    pipeline_id      INTEGER,
    step             TEXT,
    deps_left        INTEGER NOT NULL DEFAULT 0,
    limit_key        TEXT    NOT NULL DEFAULT '',
    resources        TEXT,
    wait_reason      TEXT    NOT NULL DEFAULT ''
);

INSERT INTO flotilla_tasks_new (
    id, kind, key, bucket, status, status_version, priority, run_at, attempt, max_attempts, timeout_ms,
    payload, result, progress, error, claim_seq, owner, node, epoch, lease_expires_at, stop_requested,
    pause_requested, schedule, scheduled_for, unique_key, created_at, started_at, finished_at, updated_at,
    pipeline_id, step, deps_left, limit_key, resources, wait_reason)
SELECT
    id, kind, key, bucket, status, status_version, priority, run_at, attempt, max_attempts, timeout_ms,
    payload, result, progress, error, claim_seq, owner, node, epoch, lease_expires_at, stop_requested,
    pause_requested, schedule, scheduled_for, unique_key, created_at, started_at, finished_at, updated_at,
    pipeline_id, step, deps_left, limit_key, resources, wait_reason
FROM flotilla_tasks
ORDER BY id;

DROP TABLE flotilla_tasks;
ALTER TABLE flotilla_tasks_new RENAME TO flotilla_tasks;

-- The indexes of migrations 1, 2, 4 and 5, as they were.
CREATE INDEX flotilla_tasks_claim_idx ON flotilla_tasks (priority DESC, run_at, id)
    WHERE status IN ('queued', 'scheduled', 'retrying');
CREATE INDEX flotilla_tasks_active_idx ON flotilla_tasks (bucket)
    WHERE status IN ('running', 'stopping', 'pausing');
CREATE UNIQUE INDEX flotilla_tasks_schedule_tick_idx ON flotilla_tasks (schedule, scheduled_for)
    WHERE schedule IS NOT NULL;
CREATE UNIQUE INDEX flotilla_tasks_unique_key_idx ON flotilla_tasks (unique_key)
    WHERE unique_key IS NOT NULL
      AND status NOT IN ('succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost', 'skipped');
CREATE INDEX flotilla_tasks_pipeline_idx ON flotilla_tasks (pipeline_id, id) WHERE pipeline_id IS NOT NULL;
CREATE INDEX flotilla_tasks_finished_idx ON flotilla_tasks (bucket, status, finished_at)
    WHERE status IN ('succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost', 'skipped');
CREATE INDEX flotilla_tasks_resources_waiting_idx ON flotilla_tasks (bucket)
    WHERE resources IS NOT NULL AND status IN ('queued', 'scheduled', 'retrying');

-- The copy set the sequence to the largest id copied; raise it to the
-- largest the file names anywhere.
INSERT INTO sqlite_sequence (name, seq)
SELECT 'flotilla_tasks', 0
WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'flotilla_tasks');
UPDATE sqlite_sequence SET seq = max(seq,
    (SELECT coalesce(max(task_id), 0) FROM flotilla_task_events),
    (SELECT coalesce(max(task_id), 0) FROM flotilla_commands),
    (SELECT coalesce(max(task_id), 0) FROM flotilla_task_deps),
    (SELECT coalesce(max(dep_id), 0) FROM flotilla_task_deps),
    (SELECT coalesce(max(id), 0) FROM flotilla_tasks))
WHERE name = 'flotilla_tasks';
