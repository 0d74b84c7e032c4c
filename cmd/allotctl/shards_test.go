package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
)

// TestShards: setup seeds the map from ALLOT_MYSQL_SHARDS (partition mod
// shards); `allotctl shards` prints one line a partition with its shard,
// epoch 1, its revision and its fence from ALLOT_MYSQL_DSN.
func TestShards(t *testing.T) {
	ns := natstest.New(t)
	db := dbtest.New(t)
	if _, err := db.ExecContext(context.Background(), "INSERT INTO allocator_partition (partition_id, last_seq) VALUES (1, 42)"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ALLOT_NATS_URL", ns.URL())
	t.Setenv("ALLOT_PARTITIONS", "3")
	t.Setenv("ALLOT_MYSQL_DSN", db.DSN)
	t.Setenv("ALLOT_MYSQL_SHARDS", "a="+db.DSN+",b=u:secret@tcp(127.0.0.1:1)/allot")
	if code, _, stderr := allotctl(t, "setup"); code != 0 || strings.Contains(stderr, "secret") || !strings.Contains(stderr, "b=u:*****@") {
		t.Fatalf("setup: exit %d, want 0 and ALLOT_MYSQL_SHARDS printed masked:\n%s", code, stderr)
	}
	code, stdout, stderr := allotctl(t, "shards")
	if code != 0 {
		t.Fatalf("shards: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{`0\s+a\s+1\s+\d+\s+0`, `1\s+b\s+1\s+\d+\s+42`, `2\s+a\s+1\s+\d+\s+0`} {
		if !regexp.MustCompile(`(?m)^` + want + `\s*$`).MatchString(stdout) {
			t.Errorf("shards: no line %q in\n%s", want, stdout)
		}
	}
	if n := strings.Count(strings.TrimSpace(stdout), "\n"); n != 3 {
		t.Errorf("shards: %d lines after the header, want 3:\n%s", n, stdout)
	}
	// setup with another list of shards rewrites nothing.
	t.Setenv("ALLOT_MYSQL_SHARDS", "c="+db.DSN)
	if code, _, stderr := allotctl(t, "setup"); code != 0 {
		t.Fatalf("setup again: exit %d\n%s", code, stderr)
	}
	if _, again, _ := allotctl(t, "shards"); again != stdout {
		t.Errorf("shards after a setup with other shards:\n%s\nwant\n%s", again, stdout)
	}
	// A bad list is refused in one line.
	t.Setenv("ALLOT_MYSQL_SHARDS", "a="+db.DSN+",a="+db.DSN)
	if code, _, stderr := allotctl(t, "shards"); code != 2 || !strings.Contains(stderr, `names shard "a" twice`) {
		t.Errorf("shards with a duplicate shard: exit %d, %q", code, stderr)
	}
}
