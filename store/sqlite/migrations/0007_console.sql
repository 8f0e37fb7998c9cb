-- The operator's console, as in the PostgreSQL store's migration 9.
--
-- A task run again is a new task; this row ties the two, both ways: the
-- primary key makes a task run again once, the unique retry_id finds what a
-- new task runs again (and its creation event's reason). Retention removes
-- the row with either task.
CREATE TABLE flotilla_task_retries (
    task_id    INTEGER PRIMARY KEY,
    retry_id   INTEGER NOT NULL UNIQUE,
    retried_by TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    at         INTEGER NOT NULL
);

-- Attempts ended per minute, kind and state, as each node counted them: a
-- node adds to its own rows only, so that no two nodes write one row. Kept
-- two days (store.MinuteCountsKept); the chart reads a day at most.
CREATE TABLE flotilla_task_minutes (
    minute INTEGER NOT NULL,
    node   TEXT    NOT NULL,
    kind   TEXT    NOT NULL,
    status TEXT    NOT NULL,
    count  INTEGER NOT NULL CHECK (count > 0),
    PRIMARY KEY (minute, node, kind, status)
) WITHOUT ROWID;
