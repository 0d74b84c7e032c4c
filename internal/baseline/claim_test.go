package baseline

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/wire"
)

// The burst of the seed flash sale: 2,000 concurrent claims from 1,800 players
// (some tap twice) for 100 items.
const (
	burstClaims = 2000
	burstUsers  = 1800
	burstItems  = 100
	burstItem   = 9001
)

func checkOwners(t *testing.T, d *dbtest.DB, item int64) (owners int64) {
	t.Helper()
	owners = d.Count(t, "SELECT COUNT(*) FROM seed_inventory WHERE item_id = ?", item)
	if dup := d.Count(t, `SELECT COUNT(*) FROM (SELECT player_id FROM seed_inventory WHERE item_id = ?
		GROUP BY player_id HAVING COUNT(*) > 1) x`, item); dup != 0 {
		t.Errorf("%d players own item %d more than once, want none", dup, item)
	}
	if owners > burstItems {
		t.Errorf("oversold: %d owners of %d items", owners, burstItems)
	}
	remaining := d.Count(t, "SELECT remaining FROM seed_limited_stock WHERE item_id = ?", item)
	if remaining != burstItems-owners {
		t.Errorf("remaining = %d with %d owners, want %d", remaining, owners, burstItems-owners)
	}
	return owners
}

func TestSeedClaimBurst(t *testing.T) {
	d, db := newDB(t, DefaultMaxConns)
	ctx := context.Background()
	if _, err := ResetStock(ctx, db, burstItem, burstItems); err != nil {
		t.Fatal(err)
	}
	st := Drive(ctx, func(ctx context.Context, user int64) (string, error) {
		return SeedClaim(ctx, db, burstItem, user)
	}, burstClaims, burstUsers, burstClaims)
	t.Logf("SeedClaim: %s", st)
	if st.Errors != 0 || st.Calls != burstClaims {
		t.Fatalf("calls = %d, errors = %d (first: %s), want %d calls and no errors", st.Calls, st.Errors, st.FirstError, burstClaims)
	}
	if owners := checkOwners(t, d, burstItem); owners != burstItems {
		t.Errorf("owners = %d, want exactly %d", owners, burstItems)
	}
	if g := st.Outcomes[string(wire.OutcomeGranted)]; g != burstItems {
		t.Errorf("GRANTED answers = %d, want %d", g, burstItems)
	}
	if sum := st.Outcomes[string(wire.OutcomeGranted)] + st.Outcomes[string(wire.OutcomeSoldOut)] + st.Outcomes[string(wire.OutcomeAlreadyOwned)]; sum != burstClaims {
		t.Errorf("GRANTED+SOLD_OUT+ALREADY_OWNED = %d, want %d (outcomes %v)", sum, burstClaims, st.Outcomes)
	}
}

func TestGatedClaimBurst(t *testing.T) {
	r := newRedis(t)
	d, db := newDB(t, DefaultMaxConns)
	ctx := context.Background()
	g := NewGate(r, "")
	t.Cleanup(func() { g.Close(context.Background()) })
	if _, err := ResetStock(ctx, db, burstItem, burstItems); err != nil {
		t.Fatal(err)
	}
	if err := g.Set(ctx, burstItem, burstItems); err != nil {
		t.Fatal(err)
	}
	st := Drive(ctx, func(ctx context.Context, user int64) (string, error) {
		return GatedClaim(ctx, db, g, burstItem, user)
	}, burstClaims, burstUsers, burstClaims)
	t.Logf("GatedClaim: %s", st)
	if st.Errors != 0 || st.Calls != burstClaims {
		t.Fatalf("calls = %d, errors = %d (first: %s), want %d calls and no errors", st.Calls, st.Errors, st.FirstError, burstClaims)
	}
	owners := checkOwners(t, d, burstItem)
	if g := st.Outcomes[string(wire.OutcomeGranted)]; int64(g) != owners {
		t.Errorf("GRANTED answers = %d, owners in MySQL = %d, want equal", g, owners)
	}
	if owners < burstItems {
		// The design's known defect, reported rather than hidden: a slot
		// held by a duplicate tap turned others away, and no one came
		// after it was given back.
		t.Logf("UNDERSOLD: %d owners of %d items (the gate's give-back race of the seed flash sale)", owners, burstItems)
	}
	// The reconciliation the seed design runs after each event: the counter
	// and the database agree once the burst is over.
	left, err := g.Left(ctx, burstItem)
	if err != nil {
		t.Fatal(err)
	}
	remaining := d.Count(t, "SELECT remaining FROM seed_limited_stock WHERE item_id = ?", burstItem)
	if left != remaining {
		t.Errorf("gate counter = %d, MySQL remaining = %d, want equal", left, remaining)
	}
}

func TestGatedClaimSoldOutSparesMySQL(t *testing.T) {
	r := newRedis(t)
	d, db := newDB(t, 4)
	ctx := context.Background()
	g := NewGate(r, "")
	t.Cleanup(func() { g.Close(context.Background()) })
	if _, err := ResetStock(ctx, db, 7, 1); err != nil {
		t.Fatal(err)
	}
	if err := g.Set(ctx, 7, 0); err != nil {
		t.Fatal(err)
	}
	// The counter says none are left, so MySQL's one item is never touched.
	out, err := GatedClaim(ctx, db, g, 7, 1)
	if err != nil || out != string(wire.OutcomeSoldOut) {
		t.Fatalf("GatedClaim = %q, %v; want SOLD_OUT", out, err)
	}
	if n := d.Count(t, "SELECT remaining FROM seed_limited_stock WHERE item_id = 7"); n != 1 {
		t.Errorf("remaining = %d, want 1: a gated SOLD_OUT must not reach MySQL", n)
	}
	if left, _ := g.Left(ctx, 7); left != 0 {
		t.Errorf("counter = %d after a rejected claim, want 0 (given back)", left)
	}
}

func TestSeedClaimSequential(t *testing.T) {
	_, db := newDB(t, 4)
	ctx := context.Background()
	if _, err := ResetStock(ctx, db, 5, 2); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		player int64
		want   string
	}{
		{"first claim", 1, string(wire.OutcomeGranted)},
		{"same player again", 1, string(wire.OutcomeAlreadyOwned)},
		{"second player takes the last", 2, string(wire.OutcomeGranted)},
		{"third player finds none", 3, string(wire.OutcomeSoldOut)},
		{"owner after sell-out", 2, string(wire.OutcomeSoldOut)},
	}
	for _, s := range steps {
		got, err := SeedClaim(ctx, db, 5, s.player)
		if err != nil || got != s.want {
			t.Fatalf("%s: SeedClaim(player %d) = %q, %v; want %q", s.name, s.player, got, err, s.want)
		}
	}
	st, err := StockState(ctx, db, 5)
	if err != nil || st.Confirmed != 2 || st.Remaining != 0 || st.Capacity != 2 {
		t.Fatalf("StockState = %+v, %v; want capacity 2, confirmed 2, remaining 0", st, err)
	}
}
