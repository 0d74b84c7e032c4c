-- Requests of any size: a resize may promote a million waiters,
-- whose promoted list and events run to tens of megabytes, more than a
-- TEXT column (64 KiB) and more than one packet (max_allowed_packet) can
-- carry. processed_request keeps the head of each long value; the rest is
-- stored in pieces that each fit in a packet, in processed_request_part,
-- and the counts say how many pieces there are (0: the value is whole).
ALTER TABLE processed_request
  MODIFY promoted_user_ids MEDIUMTEXT CHARACTER SET ascii NULL,
  MODIFY events MEDIUMTEXT CHARACTER SET ascii NULL;

ALTER TABLE processed_request ADD COLUMN promoted_parts INT NOT NULL DEFAULT 0;

ALTER TABLE processed_request ADD COLUMN event_parts INT NOT NULL DEFAULT 0;

-- Piece n (1, 2, …) of a long value of the processed_request row at
-- (partition_id, seq); the row holds piece 0. col says which value: 'p'
-- promoted_user_ids (JSON, cut anywhere), 'e' events (cut between two
-- events; first_event is the index of the piece's first event).
CREATE TABLE IF NOT EXISTS processed_request_part (
  partition_id INT NOT NULL,
  seq BIGINT NOT NULL,
  col CHAR(1) CHARACTER SET ascii NOT NULL,
  piece INT NOT NULL,
  first_event INT NOT NULL DEFAULT 0,
  data MEDIUMTEXT CHARACTER SET ascii NOT NULL,
  PRIMARY KEY (partition_id, seq, col, piece)
) ENGINE=InnoDB;

-- The relay relays a long event list piece by piece: next_piece is the
-- first piece not yet relayed of the first request after last_seq.
ALTER TABLE event_relay ADD COLUMN next_piece INT NOT NULL DEFAULT 0;

-- Outbox entries the relay could not read (written by an older version,
-- say): it relays what it can of them, records them here, counts them in
-- allot_allocator_outbox_bad_entries_total and goes on with the partition.
CREATE TABLE IF NOT EXISTS outbox_skipped (
  partition_id INT NOT NULL,
  seq BIGINT NOT NULL,
  request_id CHAR(36) CHARACTER SET ascii NOT NULL,
  reason VARCHAR(1000) NOT NULL,
  skipped_at DATETIME(6) NOT NULL,
  PRIMARY KEY (partition_id, seq)
) ENGINE=InnoDB;
