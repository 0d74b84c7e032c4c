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
	m := Mix{Claim: 2, Join: 0.5}
	if back, err := ParseMix(m.String()); err != nil || back != m {
		t.Errorf("ParseMix(%q) = %+v, %v; want the round trip %+v", m.String(), back, err, m)
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
