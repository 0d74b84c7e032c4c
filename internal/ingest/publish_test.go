package ingest

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/wire"
)

// TestDefiniteRefusalIsAnsweredAtOnce: a publish the broker refuses for a
// reason that waiting does not change was retried until the publish
// deadline, holding an in-flight slot all along. It is answered at once,
// 503 "nothing was stored".
func TestDefiniteRefusalIsAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	const timeout = 5 * time.Second
	ctx := context.Background()
	tests := []struct {
		name  string
		spoil func(t *testing.T, h *harness)
	}{
		{"stream full", func(t *testing.T, h *harness) {
			st, err := h.js.Stream(ctx, wire.RequestStream)
			if err != nil {
				t.Fatal(err)
			}
			cfg := st.CachedInfo().Config
			cfg.MaxMsgs, cfg.Discard = 1, jetstream.DiscardNew
			if _, err := h.js.UpdateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/1"})
			accepted(t, "the one message the stream holds", resp, body)
		}},
		{"wrong stream", func(t *testing.T, h *harness) {
			if err := h.js.DeleteStream(ctx, wire.RequestStream); err != nil {
				t.Fatal(err)
			}
			if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{wire.RequestSubjectPrefix + ">"}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"no stream", func(t *testing.T, h *harness) {
			if err := h.js.DeleteStream(ctx, wire.RequestStream); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Options{PublishTimeout: timeout})
			tt.spoil(t, h)
			start := time.Now()
			resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/2"})
			took := time.Since(start)
			wantStatus(t, tt.name, resp, body, http.StatusServiceUnavailable)
			if msg := errorSentence(t, tt.name, resp, body); msg != msgBrokerDown {
				t.Errorf("%s: %q, want %q", tt.name, msg, msgBrokerDown)
			}
			if loc := resp.Header.Get("Location"); loc != "" {
				t.Errorf("%s: Location %q on a request that is not stored", tt.name, loc)
			}
			if took > timeout/2 {
				t.Errorf("%s: answered after %s, want at once (the publish deadline is %s)", tt.name, took, timeout)
			}
			if n := len(h.svc.flight); n != 0 {
				t.Errorf("%s: %d in-flight slots held after the answer", tt.name, n)
			}
		})
	}
}

// TestLostPubAckAnswersWithTheRequestID: a request that left the process
// and got no PubAck may be stored. The 503 that said "nothing was stored"
// sent the client to retry into a second request; it carries the request
// id and its Location now, and polling it works.
func TestLostPubAckAnswersWithTheRequestID(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Options{PublishTimeout: 500 * time.Millisecond})
	// A broker that takes the message and never answers: the stream is
	// gone and a plain subscriber swallows what is published.
	if err := h.js.DeleteStream(context.Background(), wire.RequestStream); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 100)
	sub, err := h.nc.Subscribe(wire.RequestSubjectPrefix+">", func(m *nats.Msg) { got <- m.Header.Get(jetstream.MsgIDHeader) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/2", header: map[string]string{"Idempotency-Key": "k-1"}})
	wantStatus(t, "lost PubAck", resp, body, http.StatusServiceUnavailable)
	ans := decode[struct {
		Error     string `json:"error"`
		RequestID string `json:"request_id"`
	}](t, "lost PubAck", body)
	if ans.RequestID == "" || resp.Header.Get("Location") != "/v1/requests/"+ans.RequestID {
		t.Fatalf("lost PubAck: request_id %q, Location %q: want the id and its Location", ans.RequestID, resp.Header.Get("Location"))
	}
	if strings.Contains(ans.Error, "nothing was stored") || !strings.HasSuffix(ans.Error, ".") {
		t.Errorf("lost PubAck: error %q, want one sentence that does not say nothing was stored", ans.Error)
	}
	select {
	case id := <-got:
		if id != ans.RequestID {
			t.Fatalf("the message that left carries Nats-Msg-Id %s, the answer %s", id, ans.RequestID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no copy of the request left the process")
	}
	resp, body = h.do(req{method: "GET", path: "/v1/requests/" + ans.RequestID})
	wantStatus(t, "poll of the id", resp, body, http.StatusOK)
	if r := decode[wire.Result](t, "poll of the id", body); r.State != wire.StatePending {
		t.Errorf("poll of the id: state %s, want pending", r.State)
	}
	// The same key, retried, is the same request.
	resp, body = h.do(req{method: "POST", path: "/v1/activities/1/signups/2", header: map[string]string{"Idempotency-Key": "k-1"}})
	wantStatus(t, "retry with the key", resp, body, http.StatusServiceUnavailable)
	if again := decode[struct {
		Error     string `json:"error"`
		RequestID string `json:"request_id"`
	}](t, "retry with the key", body); again.RequestID != ans.RequestID {
		t.Fatalf("retry with the same key answered id %s, want %s", again.RequestID, ans.RequestID)
	}
}
