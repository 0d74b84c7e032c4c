package checkpoint_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store/checkpoint"
)

// TestCheckpointTakeAndPrune: a checkpoint copies the partition's rows at
// its fence (only its activities, CANCELLED signups included, across
// pages), its digest is that of the rows, a second take at the same fence
// is a no-op, and pruning keeps what the stream still reaches and the
// newest.
func TestCheckpointTakeAndPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, ok, err := checkpoint.Take(ctx, db.DB, 0, 1, nil); err != nil || ok {
		t.Fatalf("before anything is applied: took %v, %v; want nothing to take", ok, err)
	}
	exec("INSERT INTO allocator_partition (partition_id, last_seq) VALUES (0, 5000)")
	// Even activities belong to the partition; 2,500 signups on activity 2
	// span two pages.
	for a := int64(1); a <= 3; a++ {
		exec("INSERT INTO activity (id, capacity, confirmed_count, next_seq) VALUES (?, 3000, 0, 4000)", a)
	}
	// Activity 4 holds seats: one HELD, one CONFIRMED, under a 90 s hold.
	exec("INSERT INTO activity (id, capacity, confirmed_count, next_seq, hold_ns, held_count) VALUES (4, 3000, 2, 4000, ?, 1)", int64(90*time.Second))
	until := time.Date(2026, 12, 1, 3, 0, 1, 234567000, time.UTC)
	exec("INSERT INTO activity_signup (activity_id, user_id, status, queue_seq, held_until, hold_seq) VALUES (4, 1, 'HELD', 10, ?, 12), (4, 2, 'CONFIRMED', 11, NULL, NULL)", until)
	want := checkpoint.NewDigester()
	want.Activity(2, 3000, 0, 4000, 0, 0)
	want.Activity(4, 3000, 2, 4000, 90*time.Second, 1)
	for u := int64(1); u <= 2500; u++ {
		status := "WAITING"
		if u%10 == 0 {
			status = "CANCELLED"
		}
		exec("INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (2, ?, ?, ?), (3, ?, 'WAITING', ?)", u, status, u, u, u)
		want.Signup(2, u, status, uint64(u), time.Time{}, 0)
	}
	want.Signup(4, 1, "HELD", 10, until, 12)
	want.Signup(4, 2, "CONFIRMED", 11, time.Time{}, 0)
	even := func(a int64) bool { return a%2 == 0 }
	cp, ok, err := checkpoint.Take(ctx, db.DB, 0, 2, even)
	if err != nil || !ok {
		t.Fatalf("take: %v, %v", ok, err)
	}
	if cp.Seq != 5000 || cp.Activities != 2 || cp.Signups != 2502 || cp.Digest != want.Sum() {
		t.Fatalf("checkpoint %+v, want seq 5000, 2 activities, 2502 signups, digest %s", cp, want.Sum())
	}
	// The holds are copied as they are.
	var (
		hold, held int64
		gotUntil   time.Time
		holdSeq    uint64
	)
	if err := db.QueryRowContext(ctx, "SELECT hold_ns, held_count FROM allocator_checkpoint_activity WHERE seq = 5000 AND activity_id = 4").Scan(&hold, &held); err != nil ||
		hold != int64(90*time.Second) || held != 1 {
		t.Errorf("checkpoint of activity 4: hold_ns %d, held_count %d (%v); want 90s and 1", hold, held, err)
	}
	if err := db.QueryRowContext(ctx, "SELECT held_until, hold_seq FROM allocator_checkpoint_signup WHERE seq = 5000 AND activity_id = 4 AND user_id = 1").Scan(&gotUntil, &holdSeq); err != nil ||
		!gotUntil.Equal(until) || holdSeq != 12 {
		t.Errorf("checkpoint of the HELD signup: held_until %v, hold_seq %d (%v); want %v and 12", gotUntil, holdSeq, err, until)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM allocator_checkpoint_signup WHERE seq = 5000 AND held_until IS NULL AND hold_seq IS NULL"); n != 2501 {
		t.Errorf("%d rows without a hold copied, want 2501", n)
	}
	// A digest without holds is the one of before holds: older
	// checkpoints still verify.
	plain := checkpoint.NewDigester()
	plain.Activity(2, 3000, 0, 4000, 0, 0)
	plain.Signup(2, 1, "WAITING", 1, time.Time{}, 0)
	old := sha256.Sum256([]byte("a 2 3000 0 4000\ns 2 1 WAITING 1\n"))
	if plain.Sum() != hex.EncodeToString(old[:]) {
		t.Errorf("digest of rows without holds changed: %s", plain.Sum())
	}
	// The lines of activity 4 and its HELD signup, pinned by a digest
	// computed outside Go:
	//   printf 'a 4 3000 2 4000 90000000000 1\ns 4 1 HELD 10 1796094001234567 12\n' | sha256sum
	// (1796094001234567 is the hold's end, 2026-12-01T03:00:01.234567Z, in
	// Unix microseconds).
	holds := checkpoint.NewDigester()
	holds.Activity(4, 3000, 2, 4000, 90*time.Second, 1)
	holds.Signup(4, 1, "HELD", 10, until, 12)
	if got, want := holds.Sum(), "38c9b0281e4eb481dc2afbe6a0f265b81c7a7d7335bd58c58d843c9fb7c2c3b1"; got != want {
		t.Errorf("digest of a hold activity and its HELD signup: %s, want %s", got, want)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM allocator_checkpoint_signup WHERE seq = 5000 AND status = 'CANCELLED'"); n != 250 {
		t.Errorf("%d CANCELLED rows copied, want 250", n)
	}
	if _, ok, err := checkpoint.Take(ctx, db.DB, 0, 2, even); err != nil || ok {
		t.Fatalf("a second take at the same fence: %v, %v; want nothing taken", ok, err)
	}
	got, ok, err := checkpoint.Latest(ctx, db.DB, 0)
	if err != nil || !ok || got.Seq != 5000 || got.Digest != cp.Digest {
		t.Fatalf("latest: %+v, %v, %v", got, ok, err)
	}

	for _, seq := range []int{6000, 7000} {
		exec("UPDATE allocator_partition SET last_seq = ? WHERE partition_id = 0", seq)
		if _, ok, err := checkpoint.Take(ctx, db.DB, 0, 2, even); err != nil || !ok {
			t.Fatalf("take at %d: %v, %v", seq, ok, err)
		}
	}
	// The stream starts at 6001: the checkpoint at 5000 is of no use.
	if n, err := checkpoint.Prune(ctx, db.DB, 0, 6000); err != nil || n != 1 {
		t.Fatalf("prune below 6000: %d, %v; want 1", n, err)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM allocator_checkpoint_signup WHERE seq = 5000"); n != 0 {
		t.Errorf("%d rows of the pruned checkpoint left", n)
	}
	// Even when the stream has moved past every checkpoint, the newest stays.
	if n, err := checkpoint.Prune(ctx, db.DB, 0, 9000); err != nil || n != 1 {
		t.Fatalf("prune below 9000: %d, %v; want 1 (the newest kept)", n, err)
	}
	if got, ok, _ := checkpoint.Latest(ctx, db.DB, 0); !ok || got.Seq != 7000 {
		t.Fatalf("after pruning: newest %+v (%v), want seq 7000", got, ok)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM allocator_checkpoint_signup WHERE seq = 7000"); n != 2502 {
		t.Errorf("the newest checkpoint has %d signup rows, want 2502", n)
	}
}
