-- Request batches: one message may carry many requests, so a request's
-- place in the order is (stream sequence of its message, index in its
-- batch). Rows keyed by a request's stream sequence gain its index
-- (batch_index, 0 for a single request), and the numbers the allocator
-- orders by (queue_seq, hold_seq, next_seq, a waitlist bucket's first_seq)
-- become places packed as seq * 65536 + index (wire.Place), which order as
-- the pairs do. The allocator's fence, checkpoints and the relay's cursor
-- stay stream sequences of messages: a message is applied whole.
ALTER TABLE processed_request ADD COLUMN batch_index INT NOT NULL DEFAULT 0;

ALTER TABLE processed_request DROP PRIMARY KEY, ADD PRIMARY KEY (partition_id, seq, batch_index);

ALTER TABLE processed_request_part ADD COLUMN batch_index INT NOT NULL DEFAULT 0;

ALTER TABLE processed_request_part DROP PRIMARY KEY, ADD PRIMARY KEY (partition_id, seq, batch_index, col, piece);

ALTER TABLE outbox_skipped ADD COLUMN batch_index INT NOT NULL DEFAULT 0;

ALTER TABLE outbox_skipped DROP PRIMARY KEY, ADD PRIMARY KEY (partition_id, seq, batch_index);

ALTER TABLE rejected_message ADD COLUMN batch_index INT NOT NULL DEFAULT 0;

ALTER TABLE rejected_message DROP PRIMARY KEY, ADD PRIMARY KEY (seq, batch_index);

-- The relay's cursor: the last (seq, batch_index) whose events are out.
ALTER TABLE event_relay ADD COLUMN last_index INT NOT NULL DEFAULT 0;

-- Existing sequences become places (seq, 0), in one transaction that runs
-- once: place_migration records it.
CREATE TABLE IF NOT EXISTS place_migration (
  step VARCHAR(32) NOT NULL PRIMARY KEY,
  applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB;

START TRANSACTION;

-- Largest first, so that no row takes a place another still holds.
UPDATE activity_signup SET queue_seq = queue_seq * 65536, hold_seq = hold_seq * 65536
WHERE (SELECT COUNT(*) FROM place_migration WHERE step = 'places') = 0
ORDER BY queue_seq DESC;

UPDATE waitlist_bucket SET first_seq = first_seq * 65536
WHERE (SELECT COUNT(*) FROM place_migration WHERE step = 'places') = 0
ORDER BY first_seq DESC;

-- next_seq is one past the last place applied: (seq, 0) + 1.
UPDATE activity SET next_seq = (next_seq - 1) * 65536 + 1
WHERE next_seq > 1 AND (SELECT COUNT(*) FROM place_migration WHERE step = 'places') = 0;

INSERT IGNORE INTO place_migration (step, applied_at) VALUES ('places', CURRENT_TIMESTAMP(6));

COMMIT;

-- Checkpoints hold sequences in the old form and digests over them; the
-- allocator takes new ones as it goes (an audit from a checkpoint needs
-- one taken after this migration).
DELETE FROM allocator_checkpoint_signup;

DELETE FROM allocator_checkpoint_activity;

DELETE FROM allocator_checkpoint;
