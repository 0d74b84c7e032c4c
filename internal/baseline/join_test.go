package baseline

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/internal/wire"
)

func TestSeedJoinBurst(t *testing.T) {
	d, db := newDB(t, DefaultMaxConns)
	ctx := context.Background()
	const activity, capacity, joins = 42, 10, 50
	if _, err := ResetActivity(ctx, db, activity, capacity); err != nil {
		t.Fatal(err)
	}
	st := Drive(ctx, func(ctx context.Context, user int64) (string, error) {
		return SeedJoin(ctx, db, activity, user)
	}, joins, joins, joins)
	t.Logf("SeedJoin: %s", st)
	if st.Errors != 0 {
		t.Fatalf("%d errors, first: %s", st.Errors, st.FirstError)
	}
	if st.Outcomes[string(wire.OutcomeConfirmed)] != capacity || st.Outcomes[string(wire.OutcomeWaiting)] != joins-capacity {
		t.Fatalf("outcomes = %v, want %d CONFIRMED and %d WAITING", st.Outcomes, capacity, joins-capacity)
	}
	checks := []struct {
		name  string
		query string
		want  int64
	}{
		{"CONFIRMED rows", "SELECT COUNT(*) FROM seed_activity_signup WHERE activity_id = 42 AND status = 'CONFIRMED'", capacity},
		{"WAITING rows", "SELECT COUNT(*) FROM seed_activity_signup WHERE activity_id = 42 AND status = 'WAITING'", joins - capacity},
		{"confirmed_count", "SELECT confirmed_count FROM seed_activity WHERE id = 42", capacity},
		{"next_seq", "SELECT next_seq FROM seed_activity WHERE id = 42", joins + 1},
		{"distinct queue_seq", "SELECT COUNT(DISTINCT queue_seq) FROM seed_activity_signup WHERE activity_id = 42", joins},
		{"CONFIRMED after a WAITING in queue order", `SELECT COUNT(*) FROM seed_activity_signup c WHERE c.activity_id = 42
			AND c.status = 'CONFIRMED' AND c.queue_seq > (SELECT MIN(queue_seq) FROM seed_activity_signup
			WHERE activity_id = 42 AND status = 'WAITING')`, 0},
	}
	for _, c := range checks {
		if got := d.Count(t, c.query); got != c.want {
			t.Errorf("%s = %d, want %d", c.name, got, c.want)
		}
	}
	s, err := ActivityState(ctx, db, activity)
	if err != nil || s.Confirmed != capacity || s.Waiting != joins-capacity || s.Remaining != 0 {
		t.Errorf("ActivityState = %+v, %v; want confirmed %d, waiting %d, remaining 0", s, err, capacity, joins-capacity)
	}
}

// TestSeedCancel walks the seed waitlist's capacity-1 scenario: A confirmed, B
// and C waiting; cancel A promotes B; cancel B promotes C; A re-joins at the
// tail.
func TestSeedCancel(t *testing.T) {
	_, db := newDB(t, 4)
	ctx := context.Background()
	if _, err := ResetActivity(ctx, db, 1, 1); err != nil {
		t.Fatal(err)
	}
	const a, b, c = 10, 20, 30
	join := func(user int64, want string) {
		t.Helper()
		got, err := SeedJoin(ctx, db, 1, user)
		if err != nil || got != want {
			t.Fatalf("join %d = %q, %v; want %q", user, got, err, want)
		}
	}
	cancel := func(user int64, want string, wantPromoted int64) {
		t.Helper()
		got, promoted, err := SeedCancel(ctx, db, 1, user)
		if err != nil || got != want || promoted != wantPromoted {
			t.Fatalf("cancel %d = %q, promoted %d, %v; want %q, promoted %d", user, got, promoted, err, want, wantPromoted)
		}
	}
	join(a, string(wire.OutcomeConfirmed))
	join(b, string(wire.OutcomeWaiting))
	join(c, string(wire.OutcomeWaiting))
	join(b, string(wire.OutcomeAlreadyWaiting))
	join(a, string(wire.OutcomeAlreadyConfirmed))
	cancel(a, string(wire.OutcomeCancelled), b)
	cancel(a, string(wire.OutcomeNotSignedUp), 0)
	cancel(b, string(wire.OutcomeCancelled), c)
	join(a, string(wire.OutcomeWaiting))
	cancel(a, string(wire.OutcomeCancelled), 0)
	cancel(c, string(wire.OutcomeCancelled), 0)
	if s, err := ActivityState(ctx, db, 1); err != nil || s.Confirmed != 0 || s.Waiting != 0 {
		t.Fatalf("ActivityState = %+v, %v; want empty", s, err)
	}
	if got, err := SeedJoin(ctx, db, 999, a); err != nil || got != string(wire.OutcomeNoSuchActivity) {
		t.Fatalf("join of a missing activity = %q, %v; want NO_SUCH_ACTIVITY", got, err)
	}
}
