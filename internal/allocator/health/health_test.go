package health

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/testenv"
)

// TestMetricsServerCutsStalledClients: the metrics server had only a
// header timeout, so an idle keep-alive connection or a client that sent a
// body slowly held a connection open for ever (and Shutdown waited on it).
func TestMetricsServerCutsStalledClients(t *testing.T) {
	t.Parallel()
	for name, d := range map[string]time.Duration{"read header": metricsTimeouts.readHeader, "read": metricsTimeouts.read,
		"write": metricsTimeouts.write, "idle": metricsTimeouts.idle} {
		if d <= 0 {
			t.Errorf("metrics server %s timeout is %s, want one", name, d)
		}
	}
	short := 200 * time.Millisecond
	srv := newMetricsServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		w.Write([]byte("ok"))       //nolint:errcheck
	}), serverTimeouts{readHeader: short, read: short, write: short, idle: short})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck
	defer srv.Close()

	tests := []struct {
		name, send string
	}{
		{"idle keep-alive connection", "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"body that never comes", "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"},
	}
	for _, tt := range tests {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(tt.send)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		_, err = io.Copy(io.Discard, c)                    // until the server closes it
		c.Close()
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			t.Errorf("%s: still open after 5s, want it closed after about %s", tt.name, short)
		}
	}
}

// TestReadyzNamesGivenUpPartitions: /readyz answers 503 naming the
// partitions this process gave up, and 200 again once none is.
func TestReadyzNamesGivenUpPartitions(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ns := natstest.New(t)
	nc, _ := ns.Connect(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := New(map[string]*sql.DB{"default": db.DB}, nc)
	h.SetReady()
	stalls := &h.stalls
	part, err := Serve(ln.Addr().String(), ln, prometheus.NewRegistry(), h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- part.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-served })
	p := &proc{addr: ln.Addr().String()}
	testenv.WaitFor(t, 10*time.Second, "/readyz 200", func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK })
	stalls.set(3, "default", true)
	stalls.set(1, "default", true)
	if code, body := p.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, ": 1, 3.") {
		t.Fatalf("/readyz with partitions 1 and 3 given up: %d %s", code, body)
	}
	stalls.set(1, "default", false)
	stalls.set(3, "default", false)
	if code, body := p.get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz once none is given up: %d %s", code, body)
	}
}

// TestReadyzNamesUnreachableShards: with one shard's server away /readyz
// stays 200 and lists it down (only its partitions wait); a partition
// given up on the shard away keeps it 200, one given up on a shard that
// answers makes it 503; with every shard away, as with one database,
// MySQL is unreachable.
func TestReadyzNamesUnreachableShards(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ns := natstest.New(t)
	nc, _ := ns.Connect(t)
	away, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/allot?timeout=1s") // nothing listens on port 1
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { away.Close() })
	type stall struct {
		p     int
		shard string
	}
	for _, c := range []struct {
		dbs    map[string]*sql.DB
		stalls []stall
		code   int
		want   string
	}{
		{map[string]*sql.DB{"s0": db.DB, "s1": away}, nil, http.StatusOK, `"shards":{"s0":"up","s1":"down"}`},
		{map[string]*sql.DB{"s0": db.DB, "s1": away}, []stall{{1, "s1"}}, http.StatusOK, `"status":"ready"`},
		{map[string]*sql.DB{"s0": db.DB, "s1": away}, []stall{{1, "s1"}, {2, "s0"}}, http.StatusServiceUnavailable, "waited: 2."},
		{map[string]*sql.DB{"s1": away}, nil, http.StatusServiceUnavailable, "nats or mysql is unreachable."},
		{map[string]*sql.DB{"s0": db.DB}, nil, http.StatusOK, `{"status":"ready"}`},
	} {
		h := New(c.dbs, nc)
		h.SetReady()
		for _, st := range c.stalls {
			h.SetStalled(st.p, st.shard, true)
		}
		rec := httptest.NewRecorder()
		h.readyz(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.want) {
			t.Errorf("/readyz over %d shards, given up %v: %d %s, want %d %s", len(c.dbs), c.stalls, rec.Code, rec.Body.String(), c.code, c.want)
		}
	}
}

// proc is a server to ask.
type proc struct{ addr string }

func (p *proc) get(path string) (int, string) {
	r, err := http.Get("http://" + p.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}
