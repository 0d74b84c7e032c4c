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
