-- epoch is the partition's ownership epoch on this shard: a transaction of
-- the partition commits here only while the row's epoch equals the epoch
-- the shard map (KV bucket ALLOT_SHARDS) names for it. Rows that exist
-- (every partition on its one database) take epoch 1, the map's first.
-- A move freezes the partition on its old shard (epoch NULL: no epoch
-- matches it) and writes the row on the new shard at the next epoch.
ALTER TABLE allocator_partition ADD COLUMN epoch BIGINT UNSIGNED NULL DEFAULT 1;
