-- The operator tool's MySQL user, allot_allotctl, on every shard: run once
-- as an administrator after users.sql, with @db and @allotctl_password (from
-- your secrets) set in the same session, e.g.
--
--   mysql -uroot -p -e "SET @db='allot', @allotctl_password='…'; SOURCE deploy/mysql/allotctl.sql"
--
-- deploy/mysql/init-users.sh does this in each compose MySQL container.
--   allot_allotctl  DML only (SELECT, INSERT, UPDATE, DELETE), never DDL:
--                   `allotctl shards` reads each partition's fence; moving a
--                   partition between shards copies its rows and writes its
--                   fence row on both shards.
-- It is kept apart from users.sql, which holds the runtime processes' users.
-- Running it again sets the password anew (ALTER USER after CREATE USER IF
-- NOT EXISTS), so a rotated secret takes effect.

SET @q = CONCAT('CREATE USER IF NOT EXISTS ''allot_allotctl''@''%'' IDENTIFIED BY ', QUOTE(@allotctl_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('ALTER USER ''allot_allotctl''@''%'' IDENTIFIED BY ', QUOTE(@allotctl_password));
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
SET @q = CONCAT('GRANT SELECT, INSERT, UPDATE, DELETE ON `', @db, '`.* TO ''allot_allotctl''@''%''');
PREPARE s FROM @q;
EXECUTE s;
DEALLOCATE PREPARE s;
