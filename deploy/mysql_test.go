package deploy

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store"
)

// TestAllotctlUser runs mysql/allotctl.sql on a real server (the user name
// suffixed for this test: users are server-wide) and checks what the
// operator tool's user may do: read and write allot's tables (the fences,
// a partition's rows), never change the schema. Running the file twice
// sets the password anew.
func TestAllotctlUser(t *testing.T) {
	db := dbtest.New(t)
	body, err := os.ReadFile("mysql/allotctl.sql")
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	rand.Read(b[:])
	user := "allot_allotctl_" + hex.EncodeToString(b[:])
	script := strings.ReplaceAll(string(body), "'allot_allotctl'", "'"+user+"'")
	if script == string(body) {
		t.Fatal("mysql/allotctl.sql no longer names 'allot_allotctl': update this test")
	}
	ctx := context.Background()
	t.Cleanup(func() { db.ExecContext(context.Background(), "DROP USER IF EXISTS '"+user+"'@'%'") }) //nolint:errcheck
	runScript := func(password string) {
		t.Helper()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "SET @db = ?, @allotctl_password = ?", db.Name, password); err != nil {
			t.Fatal(err)
		}
		for _, stmt := range strings.Split(script, ";\n") {
			var lines []string
			for l := range strings.Lines(stmt) {
				if !strings.HasPrefix(strings.TrimSpace(l), "--") {
					lines = append(lines, l)
				}
			}
			if q := strings.TrimSpace(strings.Join(lines, "")); q != "" {
				if _, err := conn.ExecContext(ctx, q); err != nil {
					t.Fatalf("allotctl.sql: %s: %v", q, err)
				}
			}
		}
	}
	open := func(password string) (*sql.DB, error) {
		cfg, err := mysql.ParseDSN(db.DSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Passwd = user, password
		h, err := store.Open(ctx, cfg.FormatDSN(), 2)
		if err == nil {
			t.Cleanup(func() { h.Close() })
		}
		return h, err
	}
	runScript("first-pw")
	runScript("second-pw")
	if _, err := open("first-pw"); err == nil {
		t.Fatal("the first password still works after the file ran again with another")
	}
	h, err := open("second-pw")
	if err != nil {
		t.Fatalf("open as %s: %v", user, err)
	}
	for _, q := range []string{
		"INSERT INTO allocator_partition (partition_id, last_seq) VALUES (7, 5)",
		"UPDATE allocator_partition SET last_seq = 6 WHERE partition_id = 7",
		"DELETE FROM allocator_partition WHERE partition_id = 7",
	} {
		if _, err := h.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %q: %v", user, q, err)
		}
	}
	var n int
	if err := h.QueryRowContext(ctx, "SELECT COUNT(*) FROM allocator_partition").Scan(&n); err != nil {
		t.Fatalf("%s cannot read the fences: %v", user, err)
	}
	for _, q := range []string{"CREATE TABLE evil (id INT)", "DROP TABLE activity_signup", "ALTER TABLE activity ADD COLUMN x INT"} {
		_, err := h.ExecContext(ctx, q)
		me, ok := errors.AsType[*mysql.MySQLError](err)
		if !ok || (me.Number != 1142 && me.Number != 1044) {
			t.Fatalf("%s: %q answered %v, want a privilege error", user, q, err)
		}
	}
}
