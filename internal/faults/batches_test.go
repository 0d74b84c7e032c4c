package faults

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestScenario14KillIngestMidBatch: a burst of 2,000 requests a second by
// 64 clients, which ingest's group commit carries in request batches.
// Ingest is killed with SIGKILL three times mid-burst and started again.
// At a kill the group commit mostly has a batch in flight: published, its
// PubAck not yet read. The broker stores it anyway, and its requests are applied
// once, in order, although no client was told their ids (they saw the
// connection drop). Every 202 is applied exactly once, the invariants
// hold, the audit is clean, and at least one kill landed between a
// batch's publish and its PubAck (a result nobody was answered for, in a
// batch), or the scenario proved nothing.
func TestScenario14KillIngestMidBatch(t *testing.T) {
	tr := defaultTraffic(14)
	tr.requests, tr.clients, tr.perSecond = 6000, 64, 2000
	run(t, scenario{n: 14, name: "kill-ingest-mid-batch", traffic: tr,
		fault: func(s *stack, b *burst, r *faultResult) error {
			for k := 1; k <= 3; k++ {
				if !b.reached(float64(k) / 5) {
					return errors.New("the burst ended before the fault")
				}
				r.note("killed_ingest_at=%d/%d", b.done.Load(), len(b.reqs))
				if err := s.ingest.kill(); err != nil {
					return err
				}
				s.ingestKills++
				time.Sleep(200 * time.Millisecond)
				if err := s.startIngest(); err != nil {
					return err
				}
			}
			return nil
		},
		check: func(t *testing.T, s *stack, m *summary, _ *faultResult) {
			m.notes = append(m.notes, fmt.Sprintf("stored_unanswered=%d in_batches=%d", m.extra, m.extraBatched))
			requireBatches(t, s, m, nil)
			if m.extraBatched == 0 {
				t.Errorf("no kill landed between a batch's publish and its PubAck (%d requests stored unanswered, none in a batch)", m.extra)
			}
		},
	})
}
