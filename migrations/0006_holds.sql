-- Holds: an activity may hold a seat it gives for a while
-- before it is confirmed. hold_ns is the activity's hold (0: none);
-- held_count counts its HELD signups, which confirmed_count also counts
-- (seats taken), so the CHECK constraints keep their meaning.
ALTER TABLE activity ADD COLUMN hold_ns BIGINT NOT NULL DEFAULT 0;

ALTER TABLE activity ADD COLUMN held_count INT NOT NULL DEFAULT 0;

ALTER TABLE activity ADD CONSTRAINT chk_activity_held CHECK (held_count >= 0 AND held_count <= confirmed_count AND hold_ns >= 0);

-- A HELD signup's hold: when it lapses and the stream sequence of the
-- request that created it (the expire names it). Both are set exactly on
-- HELD rows.
ALTER TABLE activity_signup ADD COLUMN held_until DATETIME(6) NULL;

ALTER TABLE activity_signup ADD COLUMN hold_seq BIGINT NULL;

ALTER TABLE activity_signup DROP CONSTRAINT chk_signup_status;

ALTER TABLE activity_signup ADD CONSTRAINT chk_signup_status CHECK (status IN ('CONFIRMED', 'WAITING', 'CANCELLED', 'HELD'));

ALTER TABLE activity_signup ADD CONSTRAINT chk_signup_hold CHECK ((status = 'HELD') = (held_until IS NOT NULL AND hold_seq IS NOT NULL));

-- The end of the hold a request created or, for a held user's repeat, of
-- the hold the user has: the result's held_until.
ALTER TABLE processed_request ADD COLUMN held_until DATETIME(6) NULL;
