-- The two seed tables, with the keys and CHECK constraints of the invariants (docs/architecture.md).
CREATE TABLE IF NOT EXISTS activity (
  id BIGINT NOT NULL PRIMARY KEY,
  capacity INT NOT NULL,
  confirmed_count INT NOT NULL DEFAULT 0,
  -- One past the stream sequence of the last request applied to this
  -- activity: the allocator's per-activity fence and cache check.
  next_seq BIGINT NOT NULL DEFAULT 1,
  CONSTRAINT chk_activity_capacity CHECK (capacity >= 0),
  CONSTRAINT chk_activity_confirmed CHECK (confirmed_count >= 0 AND confirmed_count <= capacity)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS activity_signup (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  activity_id BIGINT NOT NULL,
  user_id BIGINT NOT NULL,
  status VARCHAR(16) NOT NULL,
  queue_seq BIGINT NOT NULL,
  UNIQUE KEY uk_activity_user (activity_id, user_id),
  UNIQUE KEY uk_activity_seq (activity_id, queue_seq),
  KEY idx_waiting (activity_id, status, queue_seq),
  CONSTRAINT chk_signup_status CHECK (status IN ('CONFIRMED', 'WAITING', 'CANCELLED'))
) ENGINE=InnoDB;

-- Exactly once: one row per applied request, holding its result. It is
-- also the transactional outbox: `events` holds the events the request
-- caused ("kind:user_id;…"), written in the same transaction, and the relay
-- publishes them in seq order per partition behind the cursor in
-- event_relay, so an event is never lost after commit.
CREATE TABLE IF NOT EXISTS processed_request (
  partition_id INT NOT NULL DEFAULT 0,
  seq BIGINT NOT NULL,
  request_id CHAR(36) CHARACTER SET ascii NOT NULL,
  op VARCHAR(8) NOT NULL,
  activity_id BIGINT NOT NULL,
  user_id BIGINT NOT NULL,
  outcome VARCHAR(24) NOT NULL,
  status VARCHAR(16) NULL,
  `position` BIGINT NULL,
  promoted_user_ids TEXT NULL,
  capacity INT NULL,
  events TEXT CHARACTER SET ascii NULL,
  applied_at DATETIME(6) NOT NULL,
  -- Clustered by the order the relay and the audit read it in; stream
  -- sequences are unique across partitions, request ids unique outright.
  PRIMARY KEY (partition_id, seq),
  UNIQUE KEY uk_processed_request (request_id)
) ENGINE=InnoDB;

-- Messages the allocator refused as malformed: terminated, never applied,
-- recorded so that the audit can tell them from divergences.
CREATE TABLE IF NOT EXISTS rejected_message (
  seq BIGINT NOT NULL PRIMARY KEY,
  subject VARCHAR(255) NOT NULL,
  reason VARCHAR(255) NOT NULL,
  rejected_at DATETIME(6) NOT NULL
) ENGINE=InnoDB;

-- The outbox relay's cursor: the last processed_request.seq of a partition
-- whose events are published to ALLOT_EVENTS.
CREATE TABLE IF NOT EXISTS event_relay (
  partition_id INT NOT NULL PRIMARY KEY,
  last_seq BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB;

-- Per-partition fence: the stream sequence of the last message applied (or
-- rejected) on that partition, advanced in the same transaction as the
-- effects. Redeliveries at or below it are skipped.
CREATE TABLE IF NOT EXISTS allocator_partition (
  partition_id INT NOT NULL PRIMARY KEY,
  last_seq BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB;
