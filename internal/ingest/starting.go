package ingest

import (
	"github.com/allot-dev/allot/internal/ingest/reply"

	"net/http"
	"sync/atomic"
	"time"
)

// startGate serves the API while ingest waits for JetStream at start (a
// cluster that has just formed can take a while to create R3 streams):
// /healthz answers 200, since the process is alive and retrying, /readyz
// and every other route 503, so that a load balancer sends nothing here yet
// and a client that does is told to retry. Once the Service has started,
// open hands every request to its handler.
type startGate struct {
	next atomic.Pointer[http.Handler]
}

func (g *startGate) open(h http.Handler) { g.next.Store(&h) }

func (g *startGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := g.next.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	switch r.URL.Path {
	case "/healthz":
		reply.JSON(w, http.StatusOK, map[string]string{"status": "starting"})
	default:
		reply.RetryAfter(w, time.Second)
		reply.Error(w, http.StatusServiceUnavailable, "ingest is starting: waiting for NATS JetStream; nothing was stored.")
	}
}
