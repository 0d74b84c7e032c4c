-- Full activities, found without scanning every activity ever opened: a
-- takeover rebuilds the views of the activities that are full now, and
-- reads them through this index.
ALTER TABLE activity ADD COLUMN is_full TINYINT AS (confirmed_count >= capacity) STORED;

ALTER TABLE activity ADD KEY idx_activity_full (is_full);
