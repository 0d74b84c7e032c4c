-- A REJECTED result carries its reason: a resize below the seats taken
-- (decided by the domain, in processed_request), or a request MySQL refused
-- (recorded in rejected_message, with the request's identity when the
-- message could be decoded), so that a poll of its id answers done.
ALTER TABLE processed_request ADD COLUMN reason VARCHAR(255) NULL;
ALTER TABLE rejected_message ADD COLUMN request_id CHAR(36) CHARACTER SET ascii NULL;
ALTER TABLE rejected_message ADD COLUMN op VARCHAR(8) NULL;
ALTER TABLE rejected_message ADD COLUMN activity_id BIGINT NULL;
ALTER TABLE rejected_message ADD COLUMN user_id BIGINT NULL;
ALTER TABLE rejected_message ADD KEY idx_rejected_request (request_id);
