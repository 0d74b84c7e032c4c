package ingest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

func TestConcurrentFirstUsesOfAKeyShareOneRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	const n = 16
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, _ := http.NewRequest("POST", h.srv.URL+"/v1/activities/4/claims/2", nil)
			r.Header.Set("Idempotency-Key", "race")
			resp, err := h.cl.Do(r)
			if err != nil {
				t.Errorf("claim: %v", err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusAccepted {
				t.Errorf("claim: %d %s", resp.StatusCode, b)
				return
			}
			ids[i] = decode[wire.Ack](t, "claim", b).RequestID
		})
	}
	wg.Wait()
	for i := range ids {
		if ids[i] != ids[0] {
			t.Fatalf("concurrent uses of one key got request ids %v, want one", ids)
		}
	}
	if n := natstest.StreamMsgs(t, h.js, wire.RequestStream); n != 1 {
		t.Fatalf("%s holds %d messages, want 1", wire.RequestStream, n)
	}
}

// BenchmarkJoin measures the hot path of a write, validation to PubAck, on
// a real JetStream server, without the network between client and ingest.
func BenchmarkJoin(b *testing.B) {
	if testing.Short() {
		b.Skip("needs MariaDB and a JetStream server")
	}
	db := dbtest.New(b)
	ns := natstest.New(b)
	ns.Setup(b, config.Defaults[bus.Config]())
	nc, js := ns.Connect(b)
	svc, err := New(testConfig(), Deps{DB: db.DB, NATS: nc, JS: js, Log: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(svc.Stop)
	h := svc.Handler()
	var user atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := httptest.NewRequest("POST", "/v1/activities/1/signups/"+strconv.FormatInt(user.Add(1), 10), nil)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusAccepted {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	})
}
