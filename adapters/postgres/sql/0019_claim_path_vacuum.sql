-- tenure migration 19: autovacuum settings for the claim path's tables.
--
-- Every claim deletes its jobs' rows from `ready` and every closed attempt its receipt, so both
-- tables hold few live rows and many dead ones. Until VACUUM removes them, each claim steps over
-- the dead entries of the claim index: after a drain of 1,000,000 jobs a one-job claim read every
-- leaf page of it (~6 ms instead of ~0.05). The maintenance leader vacuums them itself when its
-- role owns them (runtime_config::reclaim_dead_rows); these settings make autovacuum do the same
-- for any role:
--   - autovacuum_vacuum_scale_factor = 0 and autovacuum_vacuum_threshold = 10000: a vacuum is
--     due after 10,000 dead rows whatever the table's size (the default, 20% of the table, never
--     comes due while the table is small and its dead rows are all the cost);
--   - autovacuum_vacuum_cost_delay = 0: the vacuum of a small, hot table runs unthrottled;
--   - vacuum_truncate = false: giving the table's empty end back to the file system takes an
--     exclusive lock that stops every claim and enqueue while it lasts.
-- ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock: claims and enqueues go on.

ALTER TABLE @schema@.ready SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
                                autovacuum_vacuum_cost_delay = 0, vacuum_truncate = false);
ALTER TABLE @schema@.receipts SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
                                   autovacuum_vacuum_cost_delay = 0, vacuum_truncate = false);
