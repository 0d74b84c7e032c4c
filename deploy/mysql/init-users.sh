#!/bin/sh
# Runs once in each MySQL container's first start (docker-entrypoint-initdb.d):
# creates allot's least-privilege users from deploy/mysql/users.sql and
# allotctl.sql with the passwords of the container's environment (compose
# reads them from .env or the shell; never commit real ones). Every shard
# runs it alike: the same users, with the same passwords, on every shard.
set -eu
docker_process_sql <<SQL
SET @db = '${MYSQL_DATABASE}',
    @migrate_password = '${DB_MIGRATE_PASSWORD}',
    @allocator_password = '${DB_ALLOCATOR_PASSWORD}',
    @ingest_password = '${DB_INGEST_PASSWORD}',
    @audit_password = '${DB_AUDIT_PASSWORD}',
    @allotctl_password = '${DB_ALLOTCTL_PASSWORD}';
$(cat /allot-mysql/users.sql)
$(cat /allot-mysql/allotctl.sql)
SQL
