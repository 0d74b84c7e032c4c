package results

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/wire"
)

// TestWantsReadsTheBatchsIDs: a result batch is decoded only when it may
// hold the result of a registered id; an id it cannot read plainly counts
// as wanted.
func TestWantsReadsTheBatchsIDs(t *testing.T) {
	ws := newWaiters(prometheus.NewGauge(prometheus.GaugeOpts{Name: "w"}))
	const a, b, c = "0190a8c2-0000-7000-8000-00000000000a", "0190a8c2-0000-7000-8000-00000000000b", "0190a8c2-0000-7000-8000-00000000000c"
	batch := wire.AppendResults(nil, []wire.Result{
		{RequestID: a, State: wire.StateDone, Op: wire.OpClaim, Outcome: wire.OutcomeSoldOut},
		{RequestID: b, State: wire.StateDone, Op: wire.OpClaim, Outcome: wire.OutcomeGranted},
	})
	if ws.wants(batch) {
		t.Fatal("wanted with nobody waiting")
	}
	wc := ws.add(c)
	if ws.wants(batch) {
		t.Fatal("wanted for an id the batch does not hold")
	}
	wb := ws.add(b)
	if !ws.wants(batch) {
		t.Fatal("not wanted, yet the batch holds a waited-for id")
	}
	ws.remove(b, wb)
	if ws.wants(batch) {
		t.Fatal("still wanted after its waiter left")
	}
	escaped := wire.AppendResults(nil, []wire.Result{{RequestID: `odd"id`, State: wire.StateDone}})
	if !ws.wants(escaped) {
		t.Fatal("an id written with an escape must count as wanted")
	}
	if !ws.wants([]byte(`{"results":[{"request_id":"unterminated`)) {
		t.Fatal("a batch it cannot read must count as wanted")
	}
	ws.remove(c, wc)
}
