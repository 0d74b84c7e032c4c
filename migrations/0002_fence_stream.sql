-- stream_id names the stream a partition's fence counts in (its creation
-- time): a fence is meaningless against a stream created anew, whose
-- sequences start again at 1.
ALTER TABLE allocator_partition ADD COLUMN stream_id VARCHAR(64) CHARACTER SET ascii NULL;
