package ingest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/schema"
	"github.com/allot-dev/allot/internal/wire"
)

// leastPrivilegeUsers runs deploy/mysql/users.sql on db's server for db's
// database, with user names suffixed for this test (users are server-wide),
// and returns the DSN of each role ("migrate", "allocator", "ingest",
// "audit"). The users are dropped at the end of t.
func leastPrivilegeUsers(t *testing.T, db *dbtest.DB) map[string]string {
	t.Helper()
	body, err := os.ReadFile(filepath.Join("..", "..", "deploy", "mysql", "users.sql"))
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	rand.Read(b[:])
	suffix := "_" + hex.EncodeToString(b[:])
	roles := []string{"migrate", "allocator", "ingest", "audit"}
	script := string(body)
	for _, r := range roles {
		script = strings.ReplaceAll(script, "'allot_"+r+"'", "'allot_"+r+suffix+"'")
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET @db = ?", db.Name); err != nil {
		t.Fatal(err)
	}
	for _, r := range roles {
		if _, err := conn.ExecContext(ctx, "SET @"+r+"_password = ?", "pw-"+r+suffix); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, r := range roles {
			db.ExecContext(context.Background(), "DROP USER IF EXISTS 'allot_"+r+suffix+"'@'%'") //nolint:errcheck
		}
	})
	for _, stmt := range strings.Split(script, ";\n") {
		var lines []string
		for l := range strings.Lines(stmt) {
			if !strings.HasPrefix(strings.TrimSpace(l), "--") {
				lines = append(lines, l)
			}
		}
		if q := strings.TrimSpace(strings.Join(lines, "")); q != "" {
			if _, err := conn.ExecContext(ctx, q); err != nil {
				t.Fatalf("users.sql: %s: %v", q, err)
			}
		}
	}
	dsns := map[string]string{}
	for _, r := range roles {
		cfg, err := mysql.ParseDSN(db.DSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Passwd = "allot_"+r+suffix, "pw-"+r+suffix
		dsns[r] = cfg.FormatDSN()
	}
	return dsns
}

// denied reports whether err is MySQL refusing a command for lack of
// privilege.
func denied(err error) bool {
	me, ok := errors.AsType[*mysql.MySQLError](err)
	return ok && (me.Number == 1142 || me.Number == 1044 || me.Number == 1227) // table, database, specific privilege
}

// TestLeastPrivilegeUsers: with the users of deploy/mysql/users.sql,
// ingest serves every read it has (activity, signup, poll, the operator
// page's feed) as allot_ingest, which cannot write; the allocator's user
// starts (Migrate with everything applied needs no DDL) and writes rows but
// cannot change the schema; the audit's user only reads.
func TestLeastPrivilegeUsers(t *testing.T) {
	t.Parallel()
	root := dbtest.New(t)
	dsns := leastPrivilegeUsers(t, root)
	ctx := context.Background()

	open := func(role string) *sql.DB {
		t.Helper()
		db, err := store.Open(ctx, dsns[role], 4)
		if err != nil {
			t.Fatalf("open as %s: %v", role, err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	alloc := open("allocator")
	if err := schema.Migrate(ctx, alloc); err != nil {
		t.Fatalf("Migrate as the allocator with everything applied: %v", err)
	}
	if _, err := alloc.ExecContext(ctx, "INSERT INTO activity (id, capacity, confirmed_count) VALUES (1, 2, 1)"); err != nil {
		t.Fatalf("the allocator's user cannot write: %v", err)
	}
	if _, err := alloc.ExecContext(ctx, "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 5, 'CONFIRMED', 1)"); err != nil {
		t.Fatalf("the allocator's user cannot write: %v", err)
	}
	if _, err := alloc.ExecContext(ctx, "DROP TABLE activity_signup"); !denied(err) {
		t.Fatalf("the allocator's user dropped a table: %v, want a privilege error", err)
	}
	for _, role := range []string{"ingest", "audit"} {
		h := open(role)
		var n int
		if err := h.QueryRowContext(ctx, "SELECT COUNT(*) FROM activity").Scan(&n); err != nil || n != 1 {
			t.Fatalf("%s reads %d activities, %v; want 1", role, n, err)
		}
		for _, q := range []string{
			"INSERT INTO activity (id, capacity) VALUES (2, 1)",
			"UPDATE activity SET capacity = 9 WHERE id = 1",
			"DELETE FROM activity_signup",
			"CREATE TABLE evil (id INT)",
		} {
			if _, err := h.ExecContext(ctx, q); !denied(err) {
				t.Fatalf("%s: %q answered %v, want a privilege error", role, q, err)
			}
		}
	}

	// The whole ingest on allot_ingest: writes (NATS only) and every read.
	h := newHarnessWith(t, root, open("ingest"), nil)
	resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/1/claims/7"})
	id := accepted(t, "claim as allot_ingest", resp, body)
	h.insertResult(wire.Result{RequestID: id, State: wire.StateDone, Op: wire.OpClaim, ActivityID: 1, UserID: 7,
		Outcome: "SOLD_OUT", AppliedAt: time.Now().UTC()})
	for _, p := range []string{"/v1/activities/1", "/v1/activities/1/signups/5", "/v1/requests/" + id, "/readyz"} {
		resp, body := h.do(req{method: http.MethodGet, path: p})
		wantStatus(t, "GET "+p+" as allot_ingest", resp, body, http.StatusOK)
	}
	resp, body = h.status(req{method: http.MethodGet, path: "/v1/activities/1/live"})
	wantStatus(t, "the live feed as allot_ingest", resp, body, http.StatusOK)
}

// TestMigrationsUser: allot_migrate applies every migration to an empty
// database; allot_allocator could not have.
func TestMigrationsUser(t *testing.T) {
	t.Parallel()
	empty := dbtest.NewEmpty(t)
	dsns := leastPrivilegeUsers(t, empty)
	ctx := context.Background()
	alloc, err := store.Open(ctx, dsns["allocator"], 2)
	if err != nil {
		t.Fatal(err)
	}
	defer alloc.Close()
	if err := schema.Migrate(ctx, alloc); !denied(err) {
		t.Fatalf("Migrate as the allocator on an empty database: %v, want a privilege error", err)
	}
	mig, err := store.Open(ctx, dsns["migrate"], 2)
	if err != nil {
		t.Fatal(err)
	}
	defer mig.Close()
	if err := schema.Migrate(ctx, mig); err != nil {
		t.Fatalf("Migrate as allot_migrate: %v", err)
	}
	if err := schema.Migrate(ctx, alloc); err != nil {
		t.Fatalf("Migrate as the allocator once migrated: %v", err)
	}
}
