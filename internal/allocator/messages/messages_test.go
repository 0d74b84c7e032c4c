package messages

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// TestTakeCountsRequests: one transaction takes whole messages until their
// requests reach the bound, and always one.
func TestTakeCountsRequests(t *testing.T) {
	for _, c := range []struct {
		counts []int
		bound  int
		want   int
	}{
		{[]int{1, 1, 1, 1}, 2, 2},
		{[]int{1000, 1000, 1000}, 500, 1}, // one big batch alone
		{[]int{300, 300, 300}, 500, 2},    // the bound reached inside the second
		{[]int{1, 1}, 500, 2},
		{nil, 500, 0},
	} {
		if got := Take(len(c.counts), c.bound, func(i int) int { return c.counts[i] }); got != c.want {
			t.Errorf("Take(%v, %d) = %d, want %d", c.counts, c.bound, got, c.want)
		}
	}
	for header, want := range map[string]int{"": 1, "7": 7, "1000": 1000, "x": 1, "0": 1, "1001": 1} {
		if got := Count(header); got != want {
			t.Errorf("Count(%q) = %d, want %d", header, got, want)
		}
	}
}

// TestExpandPlaces: each request of a batch is at its place; one that
// cannot be read or is on another activity's subject is refused alone; a
// body that does not match its header is malformed as a whole.
func TestExpandPlaces(t *testing.T) {
	enc := func(r wire.Request) []byte {
		b, _ := json.Marshal(r)
		return b
	}
	now := time.Now().UTC()
	join := wire.Request{RequestID: "01a22ef1-1297-7592-b831-fc9513c7c801", Op: wire.OpJoin, ActivityID: 1, UserID: 1, ReceivedAt: now}
	elsewhere := join
	elsewhere.ActivityID = 2
	noUser := join
	noUser.UserID = 0
	body := wire.EncodeBatch([][]byte{enc(join), enc(elsewhere), enc(noUser)})
	reqs, err := Expand(9, wire.RequestSubject(1), "3", body, 1)
	if err != nil || len(reqs) != 3 {
		t.Fatalf("Expand: %d requests, %v", len(reqs), err)
	}
	for i, r := range reqs {
		if r.Index != i || r.Place != wire.Place(9, i) {
			t.Errorf("request %d at %d (index %d), want place %d", i, r.Place, r.Index, wire.Place(9, i))
		}
		if (r.Err == nil) != (i == 0) {
			t.Errorf("request %d: error %v", i, r.Err)
		}
	}
	if _, err := Expand(9, wire.RequestSubject(1), "2", body, 1); err == nil {
		t.Error("a batch of 3 requests under Allot-Batch 2 expanded")
	}
	if _, err := Expand(9, wire.RequestSubject(1), "1", enc(join), 1); err == nil {
		t.Error("a batch whose body is no array expanded")
	}
	single, err := Expand(9, wire.RequestSubject(1), "", enc(join), 1)
	if err != nil || len(single) != 1 || single[0].Place != wire.Place(9, 0) || single[0].Err != nil {
		t.Fatalf("a single request: %+v, %v", single, err)
	}
}
