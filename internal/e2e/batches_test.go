package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/wire"
)

// TestKeyedRequestInTwoBatches: a client sends one claim with one
// Idempotency-Key through two ingests at once, among other requests for
// the same activity, so that each ingest's group commit carries the claim
// in a request batch of its own. The claim is stored twice, in two
// batches, and applied once; both answers are the recorded result. Rounds
// repeat until one puts the claim into two batches, or the test fails.
func TestKeyedRequestInTwoBatches(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2, fastFailover())
	f.ingests[0].done("PUT", "/v1/activities/1", `{"capacity": 100000}`)
	proven := false
	var users atomic.Int64
	for round := 0; round < 20 && !proven; round++ {
		key, user := fmt.Sprintf("tap-%d", round), 1_000_000+round
		var (
			wg      sync.WaitGroup
			answers [2]map[string]any
		)
		// Joins for the same activity keep both ingests' group commits
		// busy, so that requests queue up and go out in batches.
		stop := make(chan struct{})
		var fill sync.WaitGroup
		for i := range 32 {
			fill.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					path := fmt.Sprintf("/v1/activities/1/signups/%d", users.Add(1))
					if code, m, err := f.ingests[i%2].try("POST", path, ""); err != nil || code != http.StatusAccepted {
						t.Errorf("join %s: %d %v %v", path, code, m, err)
						return
					}
				}
			})
		}
		time.Sleep(20 * time.Millisecond)
		for i := range 2 {
			wg.Go(func() {
				code, m, err := f.ingests[i].try("POST", fmt.Sprintf("/v1/activities/1/claims/%d?wait=20s", user), "", "Idempotency-Key", key)
				if err != nil || code != http.StatusOK {
					t.Errorf("keyed claim through ingest %d: %d %v %v", i, code, m, err)
				}
				answers[i] = m
			})
		}
		wg.Wait()
		close(stop)
		fill.Wait()
		if t.Failed() {
			t.FailNow()
		}
		id, _ := answers[0]["request_id"].(string)
		if answers[1]["request_id"] != id {
			t.Fatalf("one key, two request ids: %v and %v", answers[0], answers[1])
		}
		for i, m := range answers {
			f.ingests[0].sameAsRecorded(fmt.Sprintf("round %d, ingest %d", round, i), m)
		}
		if n := f.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", id); n != 1 {
			t.Fatalf("request %s has %d results", id, n)
		}
		batches, alone := copiesOf(t, f.ingests[0].js, id)
		t.Logf("round %d: request %s stored in %d batches and %d times alone", round, id, batches, alone)
		proven = batches >= 2
	}
	if !proven {
		t.Fatal("no round put the keyed claim into two batches: the test proved nothing")
	}
	f.db.CheckInvariants(t)
	requireCleanAudit(t, f.ingests[0])
}

// copiesOf counts the messages of the request stream that carry request
// id: in a batch, and alone.
func copiesOf(t *testing.T, js jetstream.JetStream, id string) (batches, alone int) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		reqs, err := wire.DecodeMessage(m.Subject, m.Header.Get(wire.BatchHeader), m.Data)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		for _, r := range reqs {
			if r.Request.RequestID != id {
				continue
			}
			if len(reqs) > 1 || m.Header.Get(wire.BatchHeader) != "" {
				batches++
			} else {
				alone++
			}
		}
	}
	return batches, alone
}
