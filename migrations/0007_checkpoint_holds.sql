-- Holds in checkpoints: the activity's hold and held count, a
-- HELD signup's held_until and hold seq, as activity and activity_signup
-- keep them (0006), so that the audit restores holds from a checkpoint.
-- One column a statement: a re-run skips each one already there.
ALTER TABLE allocator_checkpoint_activity ADD COLUMN hold_ns BIGINT NOT NULL DEFAULT 0;

ALTER TABLE allocator_checkpoint_activity ADD COLUMN held_count INT NOT NULL DEFAULT 0;

ALTER TABLE allocator_checkpoint_signup ADD COLUMN held_until DATETIME(6) NULL;

ALTER TABLE allocator_checkpoint_signup ADD COLUMN hold_seq BIGINT NULL;
