package faults

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/wire"
)

// startTimeout bounds the start of one process until it is ready.
const startTimeout = 30 * time.Second

// stack is one scenario's system: its own database, its own natsd process
// and store directory, allocators and an ingest, each a real process.
type stack struct {
	t   *testing.T
	db  *dbtest.DB
	cfg stackConfig

	natsd *proc
	// nodes are every natsd of a cluster (cfg.cluster), natsd among them;
	// nodeURLs their client URLs.
	nodes     []*proc
	nodeURLs  []string
	mysqld    *proc // nil unless cfg.privateMySQL
	natsURL   string
	natsAddr  string
	allocs    []*proc
	allocAddr []string // metrics addresses, for readiness
	ingest    *proc
	ingestURL string

	// nc and js are the test's own connection, for stream reads and
	// poison messages. It reconnects across NATS restarts.
	nc *nats.Conn
	js jetstream.JetStream

	http *http.Client
	// killedForGood marks processes a fault killed and did not restart.
	killedForGood map[*proc]bool
	// setup holds the answers of the requests that opened the activities.
	setup []answer
}

// stackConfig shapes a stack.
type stackConfig struct {
	allocators int
	// allocEnv is added to each allocator's environment.
	allocEnv []string
	// ingestEnv is added to ingest's environment (ALLOT_…=…).
	ingestEnv []string
	// clients sizes the HTTP client's connection pool.
	clients int
	// privateMySQL runs the stack on a MariaDB server of its own (in
	// s.mysqld), which a fault may kill and restart without disturbing
	// the other tests.
	privateMySQL bool
	// cluster, when set, runs this many natsd processes as one JetStream
	// cluster instead of one server (see startCluster).
	cluster int
	// lostPubAcks accepts results for requests ingest answered 503, at
	// most one per 503: when a stream leader dies after a quorum stored a
	// message but before its PubAck reached ingest, ingest times out and
	// answers 503 although the request is stored and will be applied. The
	// 503 is then wrong, not the result; answering such a publish with
	// its request id is issue 10's item 5.
	lostPubAcks bool
}

func newStack(t *testing.T, cfg stackConfig) *stack {
	t.Helper()
	needSuite(t)
	if cfg.allocators == 0 {
		cfg.allocators = 1
	}
	s := &stack{t: t, cfg: cfg, killedForGood: map[*proc]bool{}}
	if cfg.privateMySQL {
		var base string
		s.mysqld, base = startMariaDB(t)
		s.db = dbtest.NewOn(t, base)
	} else {
		s.db = dbtest.New(t)
	}

	if cfg.cluster > 0 {
		s.must(s.startCluster(cfg.cluster))
	} else {
		natsPort := freePort(t)
		s.natsAddr = fmt.Sprintf("127.0.0.1:%d", natsPort)
		s.natsURL = "nats://" + s.natsAddr
		// The production setting: fsync before every PubAck.
		s.natsd = newProc(t, "natsd", "natsd", []string{
			"ALLOT_EMBEDDED_NATS_HOST=127.0.0.1",
			fmt.Sprintf("ALLOT_EMBEDDED_NATS_PORT=%d", natsPort),
			"ALLOT_EMBEDDED_NATS_STORE=" + t.TempDir(),
			"ALLOT_EMBEDDED_NATS_SYNC=0s",
		})
		s.must(s.startNATS())
	}

	common := []string{
		"ALLOT_NATS_URL=" + s.natsURL,
		"ALLOT_MYSQL_DSN=" + s.db.DSN,
		"ALLOT_LOG_LEVEL=info",
	}
	for i := range cfg.allocators {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		p := newProc(t, fmt.Sprintf("allocator-%d", i+1), "allocator", append(append(slices.Clone(common),
			"ALLOT_METRICS_ADDR="+addr,
			"ALLOT_MYSQL_MAX_CONNS=4",
		), cfg.allocEnv...))
		s.allocs = append(s.allocs, p)
		s.allocAddr = append(s.allocAddr, addr)
		s.must(s.startAllocator(i))
	}

	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s.ingestURL = "http://" + httpAddr
	s.ingest = newProc(t, "ingest", "ingest", append(append(slices.Clone(common),
		"ALLOT_HTTP_ADDR="+httpAddr,
		"ALLOT_MYSQL_MAX_CONNS=8",
		"ALLOT_INGEST_SHUTDOWN_TIMEOUT=10s",
	), cfg.ingestEnv...))
	s.must(s.startIngest())

	var err error
	s.nc, err = bus.Connect(s.natsURL, "faults-test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.must(err)
	t.Cleanup(s.nc.Close)
	s.js, err = jetstream.New(s.nc)
	s.must(err)

	clients := max(cfg.clients, 32)
	s.http = &http.Client{
		Timeout:   45 * time.Second,
		Transport: &http.Transport{MaxIdleConns: clients, MaxIdleConnsPerHost: clients, DisableCompression: true},
	}
	t.Cleanup(s.http.CloseIdleConnections)
	return s
}

func (s *stack) must(err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatal(err)
	}
}

// startNATS starts natsd and waits until it serves JetStream.
func (s *stack) startNATS() error {
	if _, err := s.natsd.start(); err != nil {
		return err
	}
	return poll(startTimeout, "natsd ready", func() (bool, error) {
		if err := s.natsd.exited(); err != nil {
			return false, fmt.Errorf("%w: %w", errDied, err)
		}
		return strings.Contains(s.natsd.current().output.String(), s.natsURL+"\n"), nil
	})
}

// startAllocator starts allocator i and waits until it serves /readyz
// (the metrics server comes up once the allocator has started).
func (s *stack) startAllocator(i int) error {
	if _, err := s.allocs[i].start(); err != nil {
		return err
	}
	return poll(startTimeout, s.allocs[i].name+" ready", httpReady(s.allocs[i], "http://"+s.allocAddr[i]+"/readyz"))
}

// startIngest starts ingest and waits until /readyz answers 200.
func (s *stack) startIngest() error {
	if _, err := s.ingest.start(); err != nil {
		return err
	}
	return poll(startTimeout, "ingest ready", httpReady(s.ingest, s.ingestURL+"/readyz"))
}

// restartAllocator kills allocator i with SIGKILL, starts it again with the
// same environment and waits until it is ready.
func (s *stack) restartAllocator(i int) error {
	if err := s.allocs[i].kill(); err != nil {
		return err
	}
	return s.startAllocator(i)
}

// shutdown stops every process with SIGTERM, front to back, and requires a
// clean exit of each: shutdown drains, it does not crash.
func (s *stack) shutdown() {
	s.t.Helper()
	var procs []*proc
	if s.ingest.alive() {
		procs = append(procs, s.ingest)
	}
	for _, a := range s.allocs {
		if a.alive() {
			procs = append(procs, a)
		}
	}
	procs = append(procs, s.natsProcs()...)
	for _, p := range procs {
		if err := p.stop(30 * time.Second); err != nil {
			s.t.Error(err)
		}
	}
}

// openActivities opens each activity with its capacity through HTTP and
// waits for the result.
func (s *stack) openActivities(acts []activity) {
	s.t.Helper()
	for _, a := range acts {
		req := request{method: http.MethodPut, path: fmt.Sprintf("/v1/activities/%d", a.id),
			body: fmt.Sprintf(`{"capacity": %d}`, a.capacity), wait: "10s"}
		ans := s.send(context.Background(), req)
		if ans.err != nil || ans.code != http.StatusOK || ans.state != "done" || ans.outcome != "OPENED" {
			s.t.Fatalf("open activity %d: %+v, want 200 done OPENED", a.id, ans)
		}
		s.setup = append(s.setup, ans)
	}
}

// decisions scrapes allocator i's allot_allocator_decisions_total, summed
// over ops and outcomes.
func (s *stack) decisions(i int) (float64, error) {
	resp, err := s.http.Get("http://" + s.allocAddr[i] + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, "allot_allocator_decisions_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		sum += v
	}
	return sum, nil
}

// busiestAllocator returns the running allocator that applied the most
// requests over the last 300ms — the pinned one, once consumers are
// pinned — and each one's total so far.
func (s *stack) busiestAllocator() (int, []float64, error) {
	sample := func() ([]float64, error) {
		out := make([]float64, len(s.allocs))
		for i, a := range s.allocs {
			if !a.alive() {
				out[i] = -1
				continue
			}
			v, err := s.decisions(i)
			if err != nil {
				return nil, fmt.Errorf("%s metrics: %w", a.name, err)
			}
			out[i] = v
		}
		return out, nil
	}
	before, err := sample()
	if err != nil {
		return 0, nil, err
	}
	time.Sleep(300 * time.Millisecond)
	after, err := sample()
	if err != nil {
		return 0, nil, err
	}
	best := -1
	for i := range after {
		if after[i] < 0 {
			continue
		}
		if best < 0 || after[i]-before[i] > after[best]-before[best] {
			best = i
		}
	}
	if best < 0 {
		return 0, nil, fmt.Errorf("no allocator is running")
	}
	return best, after, nil
}

// unpin asks the server to unpin partition 0's consumer from its pinned
// client, when the consumer has a priority group; it reports whether it did.
func (s *stack) unpin(ctx context.Context) (bool, error) {
	st, err := s.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		return false, err
	}
	c, err := st.Consumer(ctx, bus.AllocatorConsumer(0))
	if err != nil {
		return false, err
	}
	groups := c.CachedInfo().Config.PriorityGroups
	if len(groups) == 0 {
		return false, nil
	}
	for _, g := range groups {
		if err := st.UnpinConsumer(ctx, bus.AllocatorConsumer(0), g); err != nil {
			return false, fmt.Errorf("unpin %s group %s: %w", bus.AllocatorConsumer(0), g, err)
		}
	}
	return true, nil
}
