package reply

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

func TestResultAnswersAsJSONDoes(t *testing.T) {
	st, pos, c := wire.StatusConfirmed, int64(3), int64(5)
	at := time.Date(2026, 11, 30, 13, 3, 4, 123456000, time.UTC)
	for _, res := range []wire.Result{
		{RequestID: "01a22c9b-b802-763a-9493-74d3b88e7b49", State: wire.StateDone, Op: wire.OpClaim, ActivityID: 1, UserID: 2,
			Outcome: wire.OutcomeSoldOut, Seq: 9, Index: 4, AppliedAt: at, Shed: true},
		{RequestID: "r<&>", State: wire.StateDone, Op: wire.OpOpen, Outcome: wire.OutcomeResized, Status: &st, Position: &pos,
			PromotedUserIDs: []int64{7, 8}, Capacity: &c, HeldUntil: &at, AppliedAt: at, Reason: "é\n"},
		{},
	} {
		// Twice: the second answer comes from a reused buffer.
		for range 2 {
			w := httptest.NewRecorder()
			Result(w, http.StatusOK, res)
			want, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, '\n')
			if w.Code != http.StatusOK || w.Body.String() != string(want) {
				t.Fatalf("answer %d %s, want %s", w.Code, w.Body, want)
			}
			if got := w.Header().Get("Content-Length"); got != strconv.Itoa(len(want)) {
				t.Fatalf("Content-Length %s, want %d", got, len(want))
			}
			if got := w.Header().Get("Content-Type"); got != "application/json" {
				t.Fatalf("Content-Type %s", got)
			}
		}
	}
}
