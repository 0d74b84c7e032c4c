-- Position reads cache each activity's bucket prefix sums (docs/reads.md).
-- waitlist_version counts the batches in which waiters left the activity's
-- line (or its buckets were rebuilt): the only changes that move a
-- waiter's position, since a join only ever appends at the end. The
-- allocator bumps it in the same transaction as the signups; a cached
-- position or prefix is good while the version it was read at is current.
ALTER TABLE activity ADD COLUMN waitlist_version BIGINT NOT NULL DEFAULT 0;

ALTER TABLE activity ADD CONSTRAINT chk_activity_waitlist_version CHECK (waitlist_version >= 0);
