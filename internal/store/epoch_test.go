package store_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store"
)

// TestFenceEpoch: a fence row is created at epoch 1 only (a partition
// never moved), never at a later epoch (a moved partition's row is the
// move's to write); it locks only at its epoch; SetEpoch is a
// compare-and-set, and a frozen row (NULL) matches no epoch.
func TestFenceEpoch(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	for _, epoch := range []uint64{0, 2} {
		if err := store.EnsurePartition(ctx, db, 4, epoch); !errors.Is(err, store.ErrNotMoved) {
			t.Fatalf("EnsurePartition at epoch %d without a row: %v, want ErrNotMoved", epoch, err)
		}
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM allocator_partition"); n != 0 {
		t.Fatalf("%d fence rows created at epochs past 1, want none", n)
	}
	if err := store.EnsurePartition(ctx, db, 4, 1); err != nil {
		t.Fatal(err)
	}
	lock := func(epoch uint64) error {
		return store.WithTx(ctx, db.DB, store.TxOptions{Attempts: 1}, func(tx *sql.Tx) error {
			_, err := store.LockPartition(ctx, tx, 4, epoch)
			return err
		})
	}
	if err := lock(1); err != nil {
		t.Fatalf("lock at the row's epoch: %v", err)
	}
	if err := lock(2); !errors.Is(err, store.ErrEpoch) {
		t.Fatalf("lock at another epoch: %v, want ErrEpoch", err)
	}
	if ok, err := store.SetEpoch(ctx, db, 4, 3, 4); err != nil || ok {
		t.Fatalf("SetEpoch from an epoch the row is not at: %v, %v; want false", ok, err)
	}
	if ok, err := store.SetEpoch(ctx, db, 4, 1, 2); err != nil || !ok {
		t.Fatalf("SetEpoch 1→2: %v, %v", ok, err)
	}
	if err := store.EnsurePartition(ctx, db, 4, 2); err != nil {
		t.Fatalf("EnsurePartition at epoch 2 with its row there: %v", err)
	}
	if err := lock(2); err != nil {
		t.Fatalf("lock at the raised epoch: %v", err)
	}
	if ok, err := store.SetEpoch(ctx, db, 4, 2, 0); err != nil || !ok {
		t.Fatalf("freeze: %v, %v", ok, err)
	}
	for _, epoch := range []uint64{0, 1, 2, 3} {
		if err := lock(epoch); !errors.Is(err, store.ErrEpoch) {
			t.Fatalf("lock of a frozen row at epoch %d: %v, want ErrEpoch", epoch, err)
		}
	}
}
