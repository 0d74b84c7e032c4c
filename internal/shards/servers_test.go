package shards_test

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/shards"
)

// TestThreeServersMigrated: three private servers, one per shard, each
// with a migrated database (the fence table there and empty), and their
// DSNs accepted as an ALLOT_MYSQL_SHARDS value.
func TestThreeServersMigrated(t *testing.T) {
	bases := dbtest.Servers(t, 3)
	value := ""
	seen := map[string]bool{}
	for i, base := range bases {
		db := dbtest.NewOn(t, base)
		var n int
		if err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM allocator_partition").Scan(&n); err != nil {
			t.Fatalf("server %d: %v", i, err)
		}
		var port string
		if err := db.QueryRowContext(context.Background(), "SELECT @@port").Scan(&port); err != nil {
			t.Fatal(err)
		}
		if seen[port] {
			t.Fatalf("server %d answers on port %s like another", i, port)
		}
		seen[port] = true
		if i > 0 {
			value += ","
		}
		value += "s" + port + "=" + db.DSN
	}
	set, err := shards.Parse(value, "")
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 3 {
		t.Fatalf("%d shards, want 3", set.Len())
	}
}
