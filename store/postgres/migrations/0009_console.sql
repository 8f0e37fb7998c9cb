-- The operator's console.
--
-- A task run again (RetryTask) is a new task: final states stay final. This
-- row ties the two, both ways: the primary key makes a task run again once,
-- the unique retry_id finds what a new task runs again, and gives its
-- creation event its reason. Retention removes the row with either task.
-- A row is written once per retry: no index on the task table is added.
CREATE TABLE flotilla_task_retries (
    task_id    bigint      PRIMARY KEY,
    retry_id   bigint      NOT NULL UNIQUE,
    retried_by text        NOT NULL,
    reason     text        NOT NULL,
    at         timestamptz NOT NULL
);

-- Attempts ended per minute, kind and state, as each node counted them in
-- memory and added once a few seconds: a node writes its own rows only, so
-- no two nodes contend for one, and the chart reads this small table rather
-- than the task table. Kept two days (store.MinuteCountsKept).
CREATE TABLE flotilla_task_minutes (
    minute timestamptz NOT NULL,
    node   text        NOT NULL,
    kind   text        NOT NULL,
    status text        NOT NULL,
    count  bigint      NOT NULL CHECK (count > 0),
    PRIMARY KEY (minute, node, kind, status)
);
