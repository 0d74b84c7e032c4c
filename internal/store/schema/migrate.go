// Package schema applies allot's MySQL migrations (the files of
// migrations/) in name order, once each, safely from several processes at
// once.
package schema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/migrations"
)

// Migrate applies every migration not yet recorded in schema_migration, in
// name order. It is safe to run twice and from several processes at once: a
// named lock serialises concurrent runs, and each statement is idempotent.
func Migrate(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK('allot_migrate', 30)").Scan(&got); err != nil {
		return fmt.Errorf("migrate: take lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("migrate: another process holds the migration lock")
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK('allot_migrate')") //nolint:errcheck

	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	sort.Strings(names)
	// Read what is applied before any DDL: a process whose MySQL user has
	// no DDL rights (the allocator in a least-privilege deployment, after
	// the migration step) then starts without touching the schema.
	applied, err := appliedMigrations(ctx, conn)
	if err != nil {
		return err
	}
	if applied == nil {
		if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migration (
		version VARCHAR(255) NOT NULL PRIMARY KEY,
		applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB`); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	for _, name := range names {
		if applied[name] {
			continue
		}
		body, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		// DDL commits implicitly in MySQL, so each statement is written to be
		// idempotent (IF NOT EXISTS) rather than wrapped in a transaction.
		for _, stmt := range splitStatements(string(body)) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil && !alreadyThere(err) {
				return fmt.Errorf("migrate %s: %w", name, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO schema_migration (version) VALUES (?)", name); err != nil {
			return fmt.Errorf("migrate %s: record: %w", name, err)
		}
	}
	return nil
}

// appliedMigrations returns the versions recorded in schema_migration, or
// nil when the table does not exist yet.
func appliedMigrations(ctx context.Context, conn *sql.Conn) (map[string]bool, error) {
	rows, err := conn.QueryContext(ctx, "SELECT version FROM schema_migration")
	if me, ok := errors.AsType[*mysql.MySQLError](err); ok && me.Number == 1146 { // no such table
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: read schema_migration: %w", err)
	}
	defer rows.Close()
	applied := map[string]bool{}
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("migrate: read schema_migration: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrate: read schema_migration: %w", err)
	}
	return applied, nil
}

// alreadyThere reports an ALTER that adds what exists already (a column,
// an index, a constraint) or drops what is gone: applied before, by a run
// whose record was lost. MySQL 8 has no ADD COLUMN IF NOT EXISTS, so this
// is how such a statement stays safe to run twice on both servers.
func alreadyThere(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1060, 1061: // duplicate column, duplicate key name
		return true
	case 1091: // can't drop: no such column, key or constraint (MariaDB; MySQL for columns and keys)
		return true
	case 3821, 3940: // MySQL 8: no such check constraint (DROP CHECK), no such constraint (DROP CONSTRAINT)
		return true
	case 1826, 3822: // duplicate constraint name (MariaDB, MySQL)
		return true
	}
	return false
}

// splitStatements splits a migration on semicolons that end a line, after
// dropping "--" comment lines. Migrations keep to that simple form.
func splitStatements(body string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(body, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || trimmed == "" {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			stmt := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")
			out = append(out, stmt)
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
