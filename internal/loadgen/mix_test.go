package loadgen

import (
	"errors"
	"testing"
)

func TestParseMix(t *testing.T) {
	tests := []struct {
		in      string
		want    Mix
		wantErr bool
	}{
		{"claim=1,join=0,cancel=0", Mix{Claim: 1}, false},
		{"claim=1", Mix{Claim: 1}, false},
		{" join = 3 , cancel = 1 ", Mix{Join: 3, Cancel: 1}, false},
		{"claim=0.5,join=0.25,cancel=0.25", Mix{Claim: 0.5, Join: 0.25, Cancel: 0.25}, false},
		{"", Mix{}, true},
		{"claim", Mix{}, true},
		{"claim=x", Mix{}, true},
		{"claim=-1,join=2", Mix{}, true},
		{"claim=0,join=0", Mix{}, true},
		{"claim=1,claim=2", Mix{}, true},
		{"buy=1", Mix{}, true},
		{"claim=Inf", Mix{}, true},
		{"claim=NaN", Mix{}, true},
		{"=1", Mix{}, true},
		{"claim=1,join=1,confirm=1", Mix{Claim: 1, Join: 1, Confirm: 1}, false},
		{"confirm=0", Mix{}, true},
	}
	for _, tt := range tests {
		got, err := ParseMix(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseMix(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !errors.Is(err, ErrBadMix) {
			t.Errorf("ParseMix(%q) error %v does not wrap ErrBadMix", tt.in, err)
		}
	}
	for _, m := range []Mix{{Claim: 2, Join: 0.5}, {Join: 1, Confirm: 0.25}} {
		if back, err := ParseMix(m.String()); err != nil || back != m {
			t.Errorf("ParseMix(%q) = %+v, %v; want the round trip %+v", m.String(), back, err, m)
		}
	}
	if s := (Mix{Claim: 1}).String(); s != "claim=1,join=0,cancel=0" {
		t.Errorf("a mix without confirm prints %q, as before confirm existed", s)
	}
}

func TestPlan(t *testing.T) {
	const n, users = 2000, 1800
	p := makePlan(n, users, Mix{Claim: 3, Join: 1}, 42)
	taps := map[int64]int{}
	ops := [3]int{}
	for i, u := range p.users {
		if u < 1 || u > users {
			t.Fatalf("request %d goes to user %d, outside 1..%d", i, u, users)
		}
		taps[u]++
		ops[p.ops[i]]++
	}
	if len(taps) != users {
		t.Errorf("%d distinct users, want %d", len(taps), users)
	}
	for u, k := range taps {
		if k != 1 && k != 2 {
			t.Fatalf("user %d taps %d times, want ⌊%d/%d⌋ or ⌈%d/%d⌉", u, k, n, users, n, users)
		}
	}
	if ops[opCancel] != 0 || ops[opClaim] < 1300 || ops[opClaim] > 1700 {
		t.Errorf("ops %v: want about 1500 claims, 500 joins, no cancels", ops)
	}
	q := makePlan(n, users, Mix{Claim: 3, Join: 1}, 42)
	for i := range p.users {
		if p.users[i] != q.users[i] || p.ops[i] != q.ops[i] {
			t.Fatal("the same seed drew a different plan")
		}
	}
	if r := makePlan(n, users, Mix{Claim: 3, Join: 1}, 43); equalUsers(p.users, r.users) {
		t.Error("another seed drew the same users")
	}
}

func equalUsers(a, b []int64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestPlanConfirmAndNoShows: confirm taps are drawn by their weight, never
// for a no-show; about the no-show fraction of users are no-shows; a mix
// without confirm draws the plan it always drew.
func TestPlanConfirmAndNoShows(t *testing.T) {
	const n, users, seed, frac = 20000, 5000, 7, 0.3
	mix := Mix{Claim: 1, Join: 1, Confirm: 2}
	p := makePlan(n, users, mix, seed)
	p.dropNoShowConfirms(mix, seed, frac)
	var confirms, noShowOps int
	for i, op := range p.ops {
		ns := noShow(p.users[i], seed, frac)
		if op == opConfirm {
			confirms++
			if ns {
				t.Fatalf("request %d: no-show %d taps confirm", i, p.users[i])
			}
		}
		if ns {
			noShowOps++
		}
	}
	// Half the taps are confirms, less the no-shows' 30%.
	if confirms < 6400 || confirms > 7600 {
		t.Errorf("%d confirm taps of %d, want about %d", confirms, n, int(n*0.5*(1-frac)))
	}
	var shows int
	for u := int64(1); u <= users; u++ {
		if noShow(u, seed, frac) {
			shows++
		}
	}
	if shows < 1350 || shows > 1650 || noShow(1, seed, 0) || !noShow(1, seed, 1) {
		t.Errorf("%d no-shows of %d users, want about 1500", shows, users)
	}
	old, again := makePlan(n, users, Mix{Claim: 3, Join: 1}, seed), makePlan(n, users, Mix{Claim: 3, Join: 1}, seed)
	again.dropNoShowConfirms(Mix{Claim: 3, Join: 1}, seed, frac)
	for i := range old.ops {
		if old.ops[i] != again.ops[i] || old.ops[i] == opConfirm {
			t.Fatal("a mix without confirm drew another plan")
		}
	}
}
