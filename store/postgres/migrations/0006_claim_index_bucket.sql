-- The claim index carries each row's bucket as its last key column, so that
-- a claim tests its bucket range on the index entry itself and never reads
-- the table row of a task in a bucket it does not hold. Rows of other
-- buckets are walked past for the price of a key comparison instead of a
-- heap fetch: a node's claim then costs about as much whatever other nodes
-- hold (see claimSQL). The order is unchanged: id is unique, so the trailing
-- bucket never reorders anything.
DROP INDEX flotilla_tasks_claim_idx;
CREATE INDEX flotilla_tasks_claim_idx ON flotilla_tasks (priority DESC, run_at, id, bucket)
    WHERE status IN ('queued', 'scheduled', 'retrying');
