-- allot's MySQL users, least privilege: run once as an administrator, after
-- setting the database name and the four passwords (from your secrets) in
-- the same session, e.g.
--
--   mysql -uroot -p -e "SET @db='allot', @migrate_password='…', @allocator_password='…',
--                       @ingest_password='…', @audit_password='…'; SOURCE deploy/mysql/users.sql"
--
-- deploy/mysql/init-users.sh does this in each compose MySQL container. With
-- several shards (ALLOT_MYSQL_SHARDS), run it on every shard's primary: each
-- process connects to every shard as the same user (each shard's DSN carries
-- its password). The operator tool's user is in allotctl.sql.
-- Users (host '%'; narrow it to your network where you can):
--   allot_migrate    DDL and DML on the database: `allocator -migrate-only`, the migration step
--   allot_allocator  DML only (SELECT, INSERT, UPDATE, DELETE): the allocators; they skip the
--                    migrations when all are applied, so they start without DDL rights
--   allot_ingest     SELECT only: ingest's reads (results, activities, signups, the operator page)
--   allot_audit      SELECT only: cmd/audit
-- The test TestLeastPrivilegeUsers (internal/store) creates these users from this
-- file and proves that ingest works as allot_ingest and cannot write.
-- Running it again sets each user's password anew (ALTER USER after
-- CREATE USER IF NOT EXISTS), so a rotated secret takes effect.
-- TLS: require it per user (ALTER USER … REQUIRE SSL) and add tls=true (or a
-- registered custom config) to the DSN; see deploy/README.md.

SET @q = CONCAT('CREATE DATABASE IF NOT EXISTS `', @db, '`');
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;

SET @q = CONCAT('CREATE USER IF NOT EXISTS ''allot_migrate''@''%'' IDENTIFIED BY ', QUOTE(@migrate_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('ALTER USER ''allot_migrate''@''%'' IDENTIFIED BY ', QUOTE(@migrate_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX, REFERENCES ON `', @db, '`.* TO ''allot_migrate''@''%''');
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;

SET @q = CONCAT('CREATE USER IF NOT EXISTS ''allot_allocator''@''%'' IDENTIFIED BY ', QUOTE(@allocator_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('ALTER USER ''allot_allocator''@''%'' IDENTIFIED BY ', QUOTE(@allocator_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('GRANT SELECT, INSERT, UPDATE, DELETE ON `', @db, '`.* TO ''allot_allocator''@''%''');
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;

SET @q = CONCAT('CREATE USER IF NOT EXISTS ''allot_ingest''@''%'' IDENTIFIED BY ', QUOTE(@ingest_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('ALTER USER ''allot_ingest''@''%'' IDENTIFIED BY ', QUOTE(@ingest_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('GRANT SELECT ON `', @db, '`.* TO ''allot_ingest''@''%''');
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;

SET @q = CONCAT('CREATE USER IF NOT EXISTS ''allot_audit''@''%'' IDENTIFIED BY ', QUOTE(@audit_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('ALTER USER ''allot_audit''@''%'' IDENTIFIED BY ', QUOTE(@audit_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('GRANT SELECT ON `', @db, '`.* TO ''allot_audit''@''%''');
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
