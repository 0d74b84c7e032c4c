package audit_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/wire"
)

// TestSecondOpinionCatchesAWrongApply: when allocation.Apply decides wrong,
// the allocator records the wrong decision and a replay through Apply alone
// finds MySQL in agreement. The reference model must object. Here Apply
// (the audit's copy, standing for the allocator's) answers one join with
// another outcome, and MySQL holds that outcome too.
//
// Its wrong Apply is a test hook of this audit alone.
func TestSecondOpinionCatchesAWrongApply(t *testing.T) {
	e := newEnv(t)
	tr := applyTraffic(e, 300, 2)
	if rep := e.audit(audit.Config{}); !rep.OK {
		t.Fatalf("before the fault: %s", divergences(rep.Divergences))
	}
	j3Seq := tr.seqs[tr.j3.RequestID]
	hooks := audit.TestHooks{Apply: func(a *allocation.Activity, req allocation.Request, place uint64) (*allocation.Activity, allocation.Decision, error) {
		after, d, err := allocation.Apply(a, req, place)
		if place == wire.Place(j3Seq, 0) {
			d.Outcome = wire.OutcomeAlreadyConfirmed // a wrong answer; the state change is right
		}
		return after, d, err
	}}
	e.exec("UPDATE processed_request SET outcome = ? WHERE request_id = ?", wire.OutcomeAlreadyConfirmed, tr.j3.RequestID)

	rep := e.auditDeps(audit.Config{}, audit.Deps{Test: hooks})
	if rep.OK || len(rep.Divergences) != 1 {
		t.Fatalf("want exactly one divergence (the second opinion's), got %d:%s", len(rep.Divergences), divergences(rep.Divergences))
	}
	got := rep.Divergences[0]
	want := audit.Divergence{Seq: j3Seq, RequestID: tr.j3.RequestID, Kind: audit.KindReference, ActivityID: 51, UserID: 1,
		Expected: "CONFIRMED status CONFIRMED events confirmed:1", Actual: "ALREADY_CONFIRMED status CONFIRMED events confirmed:1"}
	if got.Detail == "" {
		t.Error("the divergence does not say why")
	}
	got.Detail = ""
	if got != want {
		t.Fatalf("divergence = %+v\nwant %+v", got, want)
	}
}

// TestEveryDivergenceKindIsReported covers the kinds no other test
// triggers: a result where none may be, an activity row missing or never
// opened, a signup row missing.
func TestEveryDivergenceKindIsReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := applyTraffic(e, 300, 2)
	if rep := e.audit(audit.Config{}); !rep.OK {
		t.Fatalf("before tampering: %s", divergences(rep.Divergences))
	}
	stray := uuid.Must(uuid.NewV7()).String()
	j2Seq, j3Seq := tr.seqs[tr.j2.RequestID], tr.seqs[tr.j3.RequestID]
	tests := []tamperCase{
		{
			name: "a result for a malformed message",
			tamper: []string{fmt.Sprintf(`INSERT INTO processed_request (seq, request_id, op, activity_id, user_id, outcome, applied_at)
				VALUES (%d, '%s', 'join', 1, 3, 'CONFIRMED', NOW(6))`, tr.poisonSeq, stray)},
			restore: []string{"DELETE FROM processed_request WHERE request_id = '" + stray + "'"},
			want: audit.Divergence{Seq: tr.poisonSeq, RequestID: stray, Kind: audit.KindResultUnexpected, ActivityID: 1, UserID: 3,
				Expected: "no processed_request row", Actual: "a row with outcome CONFIRMED"},
		},
		{
			name: "an activity row deleted",
			tamper: []string{
				"CREATE TABLE saved AS SELECT * FROM activity WHERE id = 51",
				"DELETE FROM activity WHERE id = 51",
			},
			restore: []string{"INSERT INTO activity (id, capacity, confirmed_count, next_seq, hold_ns, held_count, waiting_count) SELECT id, capacity, confirmed_count, next_seq, hold_ns, held_count, waiting_count FROM saved", "DROP TABLE saved"},
			want: audit.Divergence{Seq: j3Seq, RequestID: tr.j3.RequestID, Kind: audit.KindActivityMissing, ActivityID: 51,
				Expected: fmt.Sprintf("capacity 5, confirmed_count 1, next_seq %d", wire.Place(j3Seq, 0)+1), Actual: "no activity row"},
		},
		{
			name:    "an activity nobody opened",
			tamper:  []string{"INSERT INTO activity (id, capacity) VALUES (777, 3)"},
			restore: []string{"DELETE FROM activity WHERE id = 777"},
			want: audit.Divergence{Kind: audit.KindActivityUnexpected, ActivityID: 777,
				Expected: "no activity row (never opened)", Actual: "capacity 3, confirmed_count 0, next_seq 1"},
		},
		{
			name: "a waiting signup deleted",
			tamper: []string{
				"CREATE TABLE saved AS SELECT * FROM activity_signup WHERE activity_id = 50 AND user_id = 2",
				"DELETE FROM activity_signup WHERE activity_id = 50 AND user_id = 2",
			},
			restore: []string{"INSERT INTO activity_signup SELECT * FROM saved", "DROP TABLE saved"},
			want: audit.Divergence{Seq: j2Seq, RequestID: tr.j2.RequestID, Kind: audit.KindSignupMissing, ActivityID: 50, UserID: 2,
				Expected: fmt.Sprintf("status WAITING, queue_seq %d", wire.Place(j2Seq, 0)), Actual: "no signup row"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got := e.auditTampered(t, tt)
			if !strings.Contains(got.String(), string(tt.want.Kind)) {
				t.Fatalf("%q does not name its kind", got.String())
			}
		})
	}
	if rep := e.audit(audit.Config{}); !rep.OK {
		t.Fatalf("after restoring: %s", divergences(rep.Divergences))
	}
}
