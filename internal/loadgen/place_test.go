package loadgen

import (
	"testing"

	"github.com/allot-dev/allot/client"
)

// TestHoldsOrderByPlace: results of one user come back in any order, and
// several requests may share a message (seq) at different indexes: a
// status is stale when its place (seq, index) is before one taken in
// already, and the watch's line is ordered by the place that put each
// waiter in it.
func TestHoldsOrderByPlace(t *testing.T) {
	h := newHolds(&runner{cfg: Config{NoShow: 1}}, 0)
	st := func(s client.Status) *client.Status { return &s }

	// User 1 waits at 9#3, is seated at 9#5; the WAITING answer comes
	// back last and is stale by its index alone.
	h.observe(1, &client.Result{Outcome: client.Confirmed, Status: st(client.StatusConfirmed), Seq: 9, Index: 5})
	h.observe(1, &client.Result{Outcome: client.Waiting, Status: st(client.StatusWaiting), Seq: 9, Index: 3})
	if _, waiting := h.waiters[1]; waiting {
		t.Fatal("a WAITING at 9#3 taken in after a CONFIRMED at 9#5")
	}

	// Users 2 and 3 wait in one batch, 3 ahead of 2 by index; user 4 in
	// an earlier message.
	h.observe(2, &client.Result{Outcome: client.Waiting, Status: st(client.StatusWaiting), Seq: 12, Index: 7})
	h.observe(3, &client.Result{Outcome: client.Waiting, Status: st(client.StatusWaiting), Seq: 12, Index: 2})
	h.observe(4, &client.Result{Outcome: client.Waiting, Status: st(client.StatusWaiting), Seq: 11, Index: 900})
	if a, b, c := h.users[4].waitAt, h.users[3].waitAt, h.users[2].waitAt; !(a < b && b < c) {
		t.Fatalf("line places 4:%d 3:%d 2:%d, want 4 before 3 before 2", a, b, c)
	}
	// A later answer of user 2 in the same message, ALREADY_WAITING, keeps
	// the earlier place.
	h.observe(2, &client.Result{Outcome: client.AlreadyWaiting, Status: st(client.StatusWaiting), Seq: 12, Index: 9})
	if got := h.users[2].waitAt; got != placeOf(&client.Result{Seq: 12, Index: 7}) {
		t.Fatalf("user 2 in line at %d after a later ALREADY_WAITING, want 12#7", got)
	}
}
