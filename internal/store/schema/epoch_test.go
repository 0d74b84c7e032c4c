package schema_test

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store/schema"
)

// TestEpochMigration: fence rows written before the epoch column existed
// are at epoch 1, the shard map's first epoch, so that every partition of
// a deployment that was there before shards goes on applying.
func TestEpochMigration(t *testing.T) {
	t.Parallel()
	db := dbtest.NewEmpty(t)
	migrateBefore(t, db, "0012")
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "INSERT INTO allocator_partition (partition_id, last_seq) VALUES (0, 7), (3, 9)"); err != nil {
		t.Fatal(err)
	}
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM allocator_partition WHERE epoch = 1"); n != 2 {
		t.Fatalf("%d fence rows at epoch 1 after the migration, want 2", n)
	}
}
