package allocator

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// diagnose logs the fences, the consumers and every stream message without
// a result or a rejection, when a test waited for requests in vain.
func diagnose(t *testing.T, e *env, partitions int) {
	rows, _ := e.db.Query("SELECT partition_id, last_seq FROM allocator_partition")
	for rows.Next() {
		var p int
		var s uint64
		rows.Scan(&p, &s) //nolint:errcheck // diagnostics only
		t.Logf("fence p%d = %d", p, s)
	}
	rows.Close()
	rr, _ := e.db.Query("SELECT seq, subject, reason FROM rejected_message")
	for rr.Next() {
		var seq uint64
		var sub, reason string
		rr.Scan(&seq, &sub, &reason) //nolint:errcheck // diagnostics only
		t.Logf("rejected seq %d %s: %s", seq, sub, reason)
	}
	rr.Close()
	ctx := context.Background()
	for p := range partitions {
		c, err := e.js.Consumer(ctx, wire.RequestStream, bus.AllocatorConsumer(p))
		if err != nil {
			continue
		}
		info, _ := c.Info(ctx)
		t.Logf("consumer p%d: pending %d ackpending %d redelivered %d ackfloor %d delivered %d groups %+v waiting %d", p, info.NumPending, info.NumAckPending, info.NumRedelivered, info.AckFloor.Stream, info.Delivered.Stream, info.PriorityGroups, info.NumWaiting)
	}
	st, _ := e.js.Stream(ctx, wire.RequestStream)
	info, _ := st.Info(ctx)
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		var n int64
		e.db.QueryRow("SELECT COUNT(*) FROM processed_request WHERE seq = ?", seq).Scan(&n) //nolint:errcheck // diagnostics only
		var r int64
		e.db.QueryRow("SELECT COUNT(*) FROM rejected_message WHERE seq = ?", seq).Scan(&r) //nolint:errcheck // diagnostics only
		if n+r == 0 {
			m, _ := st.GetMsg(ctx, seq)
			t.Logf("missing seq %d subject %s", seq, m.Subject)
		}
	}
}
