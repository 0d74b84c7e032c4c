-- Reads that cost the same whatever the waitlist's length (docs/reads.md).
-- waiting_count counts the activity's WAITING signups, kept by the
-- allocator in the same transaction as the signups, like confirmed_count.
ALTER TABLE activity ADD COLUMN waiting_count INT NOT NULL DEFAULT 0;

ALTER TABLE activity ADD CONSTRAINT chk_activity_waiting CHECK (waiting_count >= 0);

-- The waitlist cut into buckets of at most 1024 consecutive waiters (in
-- queue_seq order): a bucket covers the queue_seqs from first_seq up to the
-- next bucket's first_seq, and waiting counts its WAITING signups. A
-- waiter's position is the sum of the buckets before its own plus its rank
-- in its own (store.BucketSize).
CREATE TABLE IF NOT EXISTS waitlist_bucket (
  activity_id BIGINT NOT NULL,
  first_seq BIGINT NOT NULL,
  waiting INT NOT NULL,
  PRIMARY KEY (activity_id, first_seq),
  CONSTRAINT chk_waitlist_bucket CHECK (waiting >= 0 AND waiting <= 1024)
) ENGINE=InnoDB;

-- Backfill. Each statement recomputes from the signups, so a run that died
-- after any of them is finished by running them all again.
UPDATE activity a SET waiting_count = (SELECT COUNT(*) FROM activity_signup s WHERE s.activity_id = a.id AND s.status = 'WAITING');

DELETE FROM waitlist_bucket;

INSERT INTO waitlist_bucket (activity_id, first_seq, waiting)
SELECT activity_id, MIN(queue_seq), COUNT(*) FROM (
  SELECT activity_id, queue_seq, ROW_NUMBER() OVER (PARTITION BY activity_id ORDER BY queue_seq) - 1 AS n
  FROM activity_signup WHERE status = 'WAITING'
) w GROUP BY activity_id, n DIV 1024;
