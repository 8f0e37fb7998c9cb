-- Live hand-off of buckets and the operators' pins, as in the PostgreSQL
-- store's migration 11: the successor a holder marks while it lets its tasks
-- finish, the node that handed a lease to its holder until the holder takes
-- it up (both valid under handoff_epoch only), the node an operator pinned
-- the bucket to; and, per node, whether it balances and whether it is
-- leaving. Nullable or constant defaults: the previous version's statements
-- keep working beside the new ones.
ALTER TABLE flotilla_bucket_leases ADD COLUMN successor TEXT;
ALTER TABLE flotilla_bucket_leases ADD COLUMN successor_node TEXT;
ALTER TABLE flotilla_bucket_leases ADD COLUMN handoff_at INTEGER;
ALTER TABLE flotilla_bucket_leases ADD COLUMN handed_by TEXT;
ALTER TABLE flotilla_bucket_leases ADD COLUMN handoff_epoch INTEGER;
ALTER TABLE flotilla_bucket_leases ADD COLUMN pinned_to TEXT;
ALTER TABLE flotilla_nodes ADD COLUMN balance INTEGER NOT NULL DEFAULT 0;
ALTER TABLE flotilla_nodes ADD COLUMN leaving INTEGER NOT NULL DEFAULT 0;
