-- Checkpoints: the state of one partition's activities at a fence, so that
-- the audit can verify from there once retention has removed the older
-- requests from ALLOT_REQUESTS (cmd/audit -from-checkpoint). A checkpoint is
-- written in one transaction, the header row last: a header means the rows
-- are complete. digest is the SHA-256 of the rows in canonical form
-- (store.CheckpointDigest), so that a row changed after the fact shows.
CREATE TABLE IF NOT EXISTS allocator_checkpoint (
  partition_id INT NOT NULL,
  -- The partition's fence (allocator_partition.last_seq) the state is at.
  seq BIGINT NOT NULL,
  -- ALLOT_PARTITIONS when it was taken: which activities the partition has.
  partitions INT NOT NULL,
  stream_id VARCHAR(64) CHARACTER SET ascii NULL,
  activities BIGINT NOT NULL,
  signups BIGINT NOT NULL,
  digest CHAR(64) CHARACTER SET ascii NOT NULL,
  taken_at DATETIME(6) NOT NULL,
  PRIMARY KEY (partition_id, seq)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS allocator_checkpoint_activity (
  partition_id INT NOT NULL,
  seq BIGINT NOT NULL,
  activity_id BIGINT NOT NULL,
  capacity INT NOT NULL,
  confirmed_count INT NOT NULL,
  next_seq BIGINT NOT NULL,
  PRIMARY KEY (partition_id, seq, activity_id)
) ENGINE=InnoDB;

-- Every activity_signup row of the partition's activities, CANCELLED ones
-- included: the audit compares those too.
CREATE TABLE IF NOT EXISTS allocator_checkpoint_signup (
  partition_id INT NOT NULL,
  seq BIGINT NOT NULL,
  activity_id BIGINT NOT NULL,
  user_id BIGINT NOT NULL,
  status VARCHAR(16) NOT NULL,
  queue_seq BIGINT NOT NULL,
  PRIMARY KEY (partition_id, seq, activity_id, user_id)
) ENGINE=InnoDB;
