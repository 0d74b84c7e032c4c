// Package health serves an allocator process's /metrics, /healthz and
// /readyz.
package health

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/lifecycle"
)

// serverTimeouts bound how long a client of the metrics server may hold a
// connection: a scraper that stalls must not keep it (and shutdown) busy.
type serverTimeouts struct {
	readHeader, read, write, idle time.Duration
}

var metricsTimeouts = serverTimeouts{readHeader: 5 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: 60 * time.Second}

func newMetricsServer(h http.Handler, t serverTimeouts) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: t.readHeader, ReadTimeout: t.read, WriteTimeout: t.write, IdleTimeout: t.idle}
}

// Health is what /readyz answers from.
type Health struct {
	dbs   map[string]*sql.DB // every shard's pool, by name
	nc    *nats.Conn
	ready atomic.Bool // set once every partition has started
	// stalls holds the partitions given up because they could not commit.
	stalls stallSet
}

// New returns the health of a process using the shards' pools dbs (by
// shard name) and nc: not ready yet.
func New(dbs map[string]*sql.DB, nc *nats.Conn) *Health { return &Health{dbs: dbs, nc: nc} }

// unreachable are the shards whose pool does not answer a ping within
// ctx, sorted; all are pinged at once.
func (h *Health) unreachable(ctx context.Context) []string {
	var (
		mu   sync.Mutex
		down []string
		wg   sync.WaitGroup
	)
	for name, db := range h.dbs {
		wg.Go(func() {
			if db.PingContext(ctx) != nil {
				mu.Lock()
				down = append(down, name)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(down)
	return down
}

// SetReady says every partition has started.
func (h *Health) SetReady() { h.ready.Store(true) }

// SetStalled records that partition p, applied on shard, is given up for
// want of commits (stalled true), or takes part again (false).
func (h *Health) SetStalled(p int, shard string, stalled bool) { h.stalls.set(p, shard, stalled) }

// Serve returns the part that serves /metrics, /healthz and
// /readyz on ln, or on a listener it opens on addr (nothing when both are
// unset). /readyz answers 503 until h.ready is set, while NATS or every
// MySQL shard is unreachable, and while a partition on a shard that
// answers is given up because it could not commit; its 200 lists each
// shard as up or down when there are several.
func Serve(addr string, ln net.Listener, reg *prometheus.Registry, h *Health) (*lifecycle.Part, error) {
	if addr == "" && ln == nil {
		return nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"status":"ok"}`)) //nolint:errcheck // the client is gone; nothing to do
	})
	mux.HandleFunc("GET /readyz", h.readyz)
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
	}
	p := lifecycle.HTTPServer("allocator metrics", newMetricsServer(mux, metricsTimeouts), ln, 5*time.Second, nil)
	return &p, nil
}

func (h *Health) readyz(w http.ResponseWriter, r *http.Request) {
	if !h.ready.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"the allocator is starting: waiting for NATS JetStream."}`)) //nolint:errcheck // the client is gone; nothing to do
		return
	}
	// A hung route to MySQL must not hang the probe.
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	down := h.unreachable(ctx)
	if !h.nc.IsConnected() || len(down) == len(h.dbs) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"nats or mysql is unreachable."}`)) //nolint:errcheck // the client is gone; nothing to do
		return
	}
	// A shard down stops only its partitions, which wait for it (given
	// up or not): the others apply, and the process stays ready.
	if parts := h.stalls.list(down); len(parts) > 0 {
		body, _ := json.Marshal(map[string]string{"error": fmt.Sprintf(
			"partitions given up to peers, no commit to mysql while their requests waited: %s.", joinInts(parts))})
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write(body) //nolint:errcheck // the client is gone; nothing to do
		return
	}
	if len(h.dbs) == 1 {
		w.Write([]byte(`{"status":"ready"}`)) //nolint:errcheck // the client is gone; nothing to do
		return
	}
	shards := make(map[string]string, len(h.dbs))
	for name := range h.dbs {
		shards[name] = "up"
	}
	for _, name := range down {
		shards[name] = "down"
	}
	body, _ := json.Marshal(struct {
		Status string            `json:"status"`
		Shards map[string]string `json:"shards"`
	}{"ready", shards})
	w.Write(body) //nolint:errcheck // the client is gone; nothing to do
}

// joinInts is "1, 2, 3".
func joinInts(xs []int) string {
	var b []byte
	for i, x := range xs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return string(b)
}

// stallSet is a process's given-up partitions with their shards, for
// /readyz.
type stallSet struct {
	mu sync.Mutex
	m  map[int]string
}

func (s *stallSet) set(p int, shard string, stalled bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[int]string{}
	}
	if stalled {
		s.m[p] = shard
	} else {
		delete(s.m, p)
	}
}

// list is the given-up partitions, sorted, but those on the shards down
// (which wait for their shard, not for this process).
func (s *stallSet) list(down []string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int, 0, len(s.m))
	for p, shard := range s.m {
		if !slices.Contains(down, shard) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}
