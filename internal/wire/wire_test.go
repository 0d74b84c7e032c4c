package wire

import (
	"encoding/json"
	"testing"
	"time"
)

func TestEventAppendJSONMatchesMarshal(t *testing.T) {
	at := time.Date(2026, 11, 30, 13, 3, 4, 123456000, time.UTC)
	tests := []struct {
		name string
		e    Event
	}{
		{"typical", Event{EventID: EventID("01a2-…", 0), Kind: EventPromoted, ActivityID: 9001, UserID: 42, RequestID: "01a22c9b-b802-763a-9493-74d3b88e7b49", Seq: 1234, At: at}},
		{"activity level", Event{EventID: "e", Kind: EventSoldOut, ActivityID: 1, RequestID: "r", Seq: 1, At: at.Truncate(time.Second)}},
		{"odd strings", Event{EventID: "a\"b\\c<d>&\n\t\x01é\u2028", Kind: "k", ActivityID: -5, UserID: 1 << 62, RequestID: "\xff", At: at.In(time.FixedZone("x", 3600))}},
		{"zero", Event{}},
		{"held", Event{EventID: "e", Kind: EventHeld, ActivityID: 3, UserID: 4, RequestID: "r", Seq: 9, At: at, HeldUntil: &at}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, err := json.Marshal(tc.e)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.e.AppendJSON(nil); string(got) != string(want) {
				t.Fatalf("AppendJSON = %s\nencoding/json = %s", got, want)
			}
		})
	}
}

func TestDecodeRequestRefusesTrailingData(t *testing.T) {
	_, err := DecodeRequest("alloc.req.1", []byte(`{"request_id":"01a22c9b-b802-763a-9493-74d3b88e7b49","op":"join","activity_id":1,"user_id":2} {}`))
	if err == nil {
		t.Fatal("trailing data accepted")
	}
	r, err := DecodeRequest("alloc.req.1", []byte(`{"request_id":"01a22c9b-b802-763a-9493-74d3b88e7b49","op":"join","activity_id":1,"user_id":2}`+"\n"))
	if err != nil || r.UserID != 2 {
		t.Fatalf("valid request: %+v, %v", r, err)
	}
}

func TestDecodeRequestHolds(t *testing.T) {
	id := "01a22c9b-b802-763a-9493-74d3b88e7b49"
	r, err := DecodeRequest("alloc.req.1", []byte(`{"request_id":"`+id+`","op":"open","activity_id":1,"capacity":3,"hold":"10m"}`))
	if err != nil || time.Duration(r.Hold) != 10*time.Minute {
		t.Fatalf("open with hold: %+v, %v", r, err)
	}
	if _, err := DecodeRequest("alloc.req.1", []byte(`{"request_id":"`+id+`","op":"open","activity_id":1,"capacity":3,"hold":"169h"}`)); err == nil {
		t.Fatal("a hold above 168h was accepted")
	}
	if _, err := DecodeRequest("alloc.req.1", []byte(`{"request_id":"`+id+`","op":"open","activity_id":1,"capacity":3,"hold":"soon"}`)); err == nil {
		t.Fatal("an unparsable hold was accepted")
	}
	e := ExpireRequest(1, 7, Place(42, 0), time.Unix(100, 0))
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRequest("alloc.req.1", b)
	if err != nil || got.Op != OpExpire || got.HoldSeq != 42 || got.HoldIndex != 0 || got.UserID != 7 || got.RequestID != ExpireRequestID(1, 7, Place(42, 0)) {
		t.Fatalf("expire round trip: %+v, %v", got, err)
	}
	if ExpireRequestID(1, 7, Place(42, 0)) == ExpireRequestID(1, 7, Place(43, 0)) || ExpireRequestID(1, 7, Place(42, 0)) == ExpireRequestID(1, 7, Place(42, 1)) {
		t.Fatal("two holds share an expire id")
	}
	if _, err := DecodeRequest("alloc.req.1", []byte(`{"request_id":"`+id+`","op":"expire","activity_id":1,"user_id":7}`)); err == nil {
		t.Fatal("an expire without hold_seq was accepted")
	}
}
