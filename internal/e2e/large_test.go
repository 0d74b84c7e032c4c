package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/wire"
)

// TestHugeResizeThroughHTTP is the huge resize as a user meets it:
// capacity 1, 5,001 joins, then PUT {"capacity": 6000}. The resize's
// result must poll as done with all 5,000 promoted users (its stored JSON
// and events were cut before, and the relay stopped for good), and every
// promotion must reach ALLOT_EVENTS once.
func TestHugeResizeThroughHTTP(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const joiners = 5001
	s.open(1, 1)
	var (
		wg   sync.WaitGroup
		next = make(chan int)
	)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range next {
				code, m, err := s.try("POST", fmt.Sprintf("/v1/activities/1/signups/%d", u), "")
				if err != nil || code != http.StatusAccepted {
					t.Errorf("join %d: %d %v %v", u, code, m, err)
				}
			}
		}()
	}
	for u := 1; u <= joiners; u++ {
		next <- u
	}
	close(next)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	code, m := s.call("PUT", "/v1/activities/1", `{"capacity": 6000}`)
	if code != http.StatusAccepted {
		t.Fatalf("resize: %d %v", code, m)
	}
	id := m["request_id"].(string)
	var res wire.Result
	deadline := time.Now().Add(60 * time.Second)
	for res.State != wire.StateDone {
		if time.Now().After(deadline) {
			t.Fatal("the resize was not applied within 60s")
		}
		resp, err := s.cl.Get(s.url + "/v1/requests/" + id + "?wait=10s")
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&res)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("poll the resize: %d %v", resp.StatusCode, err)
		}
	}
	if res.Outcome != wire.OutcomeResized || len(res.PromotedUserIDs) != joiners-1 {
		t.Fatalf("resize: %s with %d promoted, want RESIZED with %d", res.Outcome, len(res.PromotedUserIDs), joiners-1)
	}
	promoted := make(map[int64]bool, joiners)
	for _, u := range res.PromotedUserIDs {
		promoted[u] = true
	}
	if len(promoted) != joiners-1 {
		t.Fatalf("%d distinct users promoted, want %d", len(promoted), joiners-1)
	}
	code, m = s.call("GET", "/v1/activities/1", "")
	if code != http.StatusOK {
		t.Fatalf("activity after the resize: %d %v", code, m)
	}
	want(t, "activity after the resize", m, "confirmed", float64(joiners), "waiting", float64(0))

	// Every promotion relayed, once, to the user the result names.
	ctx := context.Background()
	c, err := s.js.OrderedConsumer(ctx, wire.EventStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.EventSubject(1, wire.EventPromoted)},
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[int64]bool, joiners)
	deadline = time.Now().Add(60 * time.Second)
	for len(seen) < joiners-1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d promoted events relayed within 60s, want %d", len(seen), joiners-1)
		}
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			var ev wire.Event
			if err := json.Unmarshal(msg.Data(), &ev); err != nil {
				t.Fatal(err)
			}
			if ev.RequestID != id || !promoted[ev.UserID] || seen[ev.UserID] {
				t.Fatalf("promoted event %+v: not one of the resize's promotions, or a second one", ev)
			}
			seen[ev.UserID] = true
		}
	}
}
