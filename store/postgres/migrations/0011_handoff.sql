-- Live hand-off of buckets between the nodes that declare them, and the
-- operators' pins.
--
-- A holder that gives a bucket marks its successor (successor,
-- successor_node, handoff_at) while it lets its tasks there finish, then
-- hands the lease over: the successor becomes its owner under the next
-- epoch, and handed_by names the giver until the successor takes it up.
-- Both hold only under handoff_epoch, so that a change of holder by a
-- binary that does not know these columns leaves nothing valid behind.
-- pinned_to is the node an operator moved the bucket to.
--
-- Every column is nullable or has a constant default: adding them rewrites
-- no row, and the statements of the previous version, which name none of
-- them, keep working beside the new ones during a rolling upgrade.
ALTER TABLE flotilla_bucket_leases
    ADD COLUMN successor      text,
    ADD COLUMN successor_node text,
    ADD COLUMN handoff_at     timestamptz,
    ADD COLUMN handed_by      text,
    ADD COLUMN handoff_epoch  bigint,
    ADD COLUMN pinned_to      text;

-- balance: the node shares the buckets it declares (nodes of the previous
-- version register false: they hold what they can, as before). leaving: it
-- shuts down and hands its buckets on; nobody hands it one.
ALTER TABLE flotilla_nodes
    ADD COLUMN balance boolean NOT NULL DEFAULT false,
    ADD COLUMN leaving boolean NOT NULL DEFAULT false;
