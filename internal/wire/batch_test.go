package wire

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestPlaceOrdersAsThePair(t *testing.T) {
	pairs := [][2]uint64{{1, 0}, {1, 1}, {1, MaxBatch - 1}, {2, 0}, {2, 7}, {1 << 40, 0}, {1<<40 + 1, 3}}
	for i, p := range pairs {
		pl := Place(p[0], int(p[1]))
		if SeqOf(pl) != p[0] || IndexOf(pl) != int(p[1]) {
			t.Fatalf("Place(%d, %d) = %d splits into %d, %d", p[0], p[1], pl, SeqOf(pl), IndexOf(pl))
		}
		if i > 0 {
			prev := pairs[i-1]
			if Place(prev[0], int(prev[1])) >= pl {
				t.Fatalf("place of %v is not below that of %v", prev, p)
			}
		}
	}
	// A hold of a single request keeps the name it had before batches.
	if got := HoldScheduleSubject(5, 6, Place(77, 0)); got != "alloc.hold.at.5.6.77" {
		t.Fatalf("single request's hold subject %q", got)
	}
	if got := HoldScheduleSubject(5, 6, Place(77, 3)); got != "alloc.hold.at.5.6.77-3" {
		t.Fatalf("batched request's hold subject %q", got)
	}
	if got := FormatPlace(Place(77, 3)); got != "77#3" {
		t.Fatalf("FormatPlace = %q", got)
	}
	if got := FormatPlace(Place(77, 0)); got != "77" {
		t.Fatalf("FormatPlace = %q", got)
	}
}

func batchOf(t *testing.T, reqs ...Request) []byte {
	t.Helper()
	enc := make([][]byte, len(reqs))
	for i, r := range reqs {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		enc[i] = b
	}
	return EncodeBatch(enc)
}

func TestDecodeMessage(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	claim := func(id string, user int64) Request {
		return Request{RequestID: id, Op: OpClaim, ActivityID: 9, UserID: user, ReceivedAt: at}
	}
	a, b := "0190a000-0000-7000-8000-000000000001", "0190a000-0000-7000-8000-000000000002"
	subject := RequestSubject(9)

	got, err := DecodeMessage(subject, "2", batchOf(t, claim(a, 1), claim(b, 2)))
	if err != nil || len(got) != 2 || got[0].Index != 0 || got[1].Index != 1 || got[1].Request.UserID != 2 || got[0].Err != nil || got[1].Err != nil {
		t.Fatalf("batch of two: %+v, %v", got, err)
	}
	// A single request is a message of one, at index 0.
	one, _ := json.Marshal(claim(a, 1))
	if got, err := DecodeMessage(subject, "", one); err != nil || len(got) != 1 || got[0].Err != nil || got[0].Request.RequestID != a {
		t.Fatalf("single: %+v, %v", got, err)
	}
	// One bad request in a batch is refused alone.
	other := claim(b, 2)
	other.ActivityID = 10
	got, err = DecodeMessage(subject, "2", batchOf(t, claim(a, 1), other))
	if err != nil || got[0].Err != nil || got[1].Err == nil {
		t.Fatalf("batch with a request for another activity: %+v, %v", got, err)
	}
	// A message that is not a batch of what it says is refused whole.
	for name, m := range map[string]struct {
		header string
		body   []byte
	}{
		"count":     {"3", batchOf(t, claim(a, 1), claim(b, 2))},
		"not array": {"1", one},
		"header":    {"two", batchOf(t, claim(a, 1))},
		"too large": {"1001", batchOf(t, claim(a, 1))},
		"zero":      {"0", []byte("[]")},
		"trailing":  {"1", append(batchOf(t, claim(a, 1)), " x"...)},
	} {
		if _, err := DecodeMessage(subject, m.header, m.body); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	// A void never rides in a batch.
	void := Request{RequestID: a, Op: OpVoid, ReceivedAt: at}
	got, err = DecodeMessage(subject, "1", batchOf(t, void))
	if err != nil || got[0].Err == nil || !strings.Contains(got[0].Err.Error(), "void") {
		t.Fatalf("void in a batch: %+v, %v", got, err)
	}
}

func TestOpsHeader(t *testing.T) {
	if got := OpsOf(OpJoin, OpClaim, OpClaim); got != "claim,join" {
		t.Fatalf("OpsOf = %q", got)
	}
	if got := OpsOf(OpClaim); got != "claim" {
		t.Fatalf("OpsOf(claim) = %q", got)
	}
	if got := OpsOf(); got != "" {
		t.Fatalf("OpsOf() = %q", got)
	}
	for ops, want := range map[string]bool{"claim": true, "claim,void": true, "void": true, "": false, "claim,join": false, "cancel": false, "bogus": false} {
		if ChangesNoClaim(ops) != want {
			t.Errorf("ChangesNoClaim(%q) = %v", ops, !want)
		}
	}
}
