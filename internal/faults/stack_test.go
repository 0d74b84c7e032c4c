package faults

import (
	"context"
	"errors"
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
	// dbs are the shards' databases, s0, s1, … (cfg.shards), each on its
	// server in shardProcs; one shard, dbs is db alone and shardProcs nil.
	dbs        []*dbtest.DB
	shardProcs []*proc
	shardBases []string // each server's DSN without a database

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
	// ingestKills counts the times a fault killed ingest mid-burst: the
	// requests it had in flight end in transport errors, their fate
	// unknown to their clients (verify).
	ingestKills int
	// setup holds the answers of the requests that opened the activities.
	setup []answer
	// setupEnv is the environment of `allotctl setup` (runSetup).
	setupEnv []string
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
	// natsPermissions runs the real nats-server with deploy/nats's users
	// and permissions, each process connecting as its role (permissions_test.go).
	natsPermissions bool
	// shards, when 2 or more, runs the stack on that many private
	// MariaDB (or MySQL) servers, one database each, named s0, s1, … in
	// ALLOT_MYSQL_SHARDS for every process; setup seeds the map
	// (partition p on shard p mod shards). Give ALLOT_PARTITIONS in
	// allocEnv and ingestEnv alike.
	shards int
}

func newStack(t *testing.T, cfg stackConfig) *stack {
	t.Helper()
	needSuite(t)
	if cfg.allocators == 0 {
		cfg.allocators = 1
	}
	s := &stack{t: t, cfg: cfg, killedForGood: map[*proc]bool{}}
	var shardList []string
	switch {
	case cfg.shards > 1:
		for i := range cfg.shards {
			p, base := startMariaDB(t)
			db := dbtest.NewOn(t, base)
			s.shardProcs = append(s.shardProcs, p)
			s.shardBases = append(s.shardBases, base)
			s.dbs = append(s.dbs, db)
			shardList = append(shardList, fmt.Sprintf("s%d=%s", i, db.DSN))
		}
		s.db = s.dbs[0]
	case cfg.privateMySQL:
		var base string
		s.mysqld, base = startMariaDB(t)
		s.db = dbtest.NewOn(t, base)
	default:
		s.db = dbtest.New(t)
	}
	if len(s.dbs) == 0 {
		s.dbs = []*dbtest.DB{s.db}
	}

	// roleURL is the NATS URL a process of role connects with.
	roleURL := func(string) string { return s.natsURL }
	switch {
	case cfg.natsPermissions:
		s.must(s.startNATSWithPermissions())
		roleURL = s.roleURL
	case cfg.cluster > 0:
		s.must(s.startCluster(cfg.cluster))
	default:
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
		"ALLOT_MYSQL_DSN=" + s.db.DSN,
		"ALLOT_LOG_LEVEL=info",
	}
	if len(shardList) > 0 {
		common = append(common, "ALLOT_MYSQL_SHARDS="+strings.Join(shardList, ","))
	}
	// The setup step first, as a deploy runs it: the binaries only check
	// the streams and buckets. It takes the settings the scenario gives
	// the binaries (ALLOT_PARTITIONS, ALLOT_STREAM_REPLICAS).
	s.setupEnv = append(append(append(slices.Clone(common), "ALLOT_NATS_URL="+roleURL("allotctl")), cfg.allocEnv...), cfg.ingestEnv...)
	s.must(s.runSetup())
	for i := range cfg.allocators {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		p := newProc(t, fmt.Sprintf("allocator-%d", i+1), "allocator", append(append(slices.Clone(common),
			"ALLOT_NATS_URL="+roleURL("allocator"),
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
		"ALLOT_NATS_URL="+roleURL("ingest"),
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

// runSetup runs `allotctl setup` until it exits, and fails unless it
// exits 0.
func (s *stack) runSetup() error {
	p := newProc(s.t, "allotctl", "allotctl", s.setupEnv, "setup")
	inc, err := p.start()
	if err != nil {
		return err
	}
	if err := poll(2*time.Minute, "allotctl setup", func() (bool, error) { return !inc.alive(), nil }); err != nil {
		return err
	}
	if code := inc.exitText(); code != "exit status 0" {
		return fmt.Errorf("allotctl setup: %s\n%s", code, inc.output.String())
	}
	return nil
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
	if err := poll(startTimeout, "natsd ready", func() (bool, error) {
		if err := s.natsd.exited(); err != nil {
			return false, fmt.Errorf("%w: %w", errDied, err)
		}
		return strings.Contains(s.natsd.current().output.String(), s.natsURL+"\n"), nil
	}); err != nil || s.nc == nil {
		return err
	}
	// The test's own connection (the checks and the audit read through
	// it) reconnects on its own time, and it fails requests until then
	// rather than buffer them (bus.Connect): wait for it too.
	return poll(startTimeout, "the test's NATS connection back", func() (bool, error) {
		return s.nc.IsConnected(), fmt.Errorf("connection %s", s.nc.Status())
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
// requests over a 300ms window — the pinned one, once consumers are pinned
// — and each one's total so far. The winner must have applied something in
// the window and more than every other one: two idle allocators, or two
// equally busy, are sampled again (for up to 10s), never picked by index,
// so a fault aimed at "the busy one" surely hits a busy one.
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
	var deltas []float64
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		before, err := sample()
		if err != nil {
			return 0, nil, err
		}
		time.Sleep(300 * time.Millisecond)
		after, err := sample()
		if err != nil {
			return 0, nil, err
		}
		best, runnerUp := -1, -1.0
		deltas = make([]float64, len(after))
		for i := range after {
			if after[i] < 0 || before[i] < 0 {
				deltas[i] = -1
				continue
			}
			deltas[i] = after[i] - before[i]
			switch {
			case best < 0 || deltas[i] > deltas[best]:
				if best >= 0 {
					runnerUp = deltas[best]
				}
				best = i
			default:
				runnerUp = max(runnerUp, deltas[i])
			}
		}
		if best < 0 {
			return 0, nil, fmt.Errorf("no allocator is running")
		}
		if deltas[best] > 0 && deltas[best] > runnerUp {
			return best, after, nil
		}
	}
	return 0, nil, fmt.Errorf("no allocator was clearly the busy one within 10s (decisions per 300ms: %v)", deltas)
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

// takeOver unpins partition 0 from frozen, the allocator just stopped with
// SIGSTOP, and waits until another allocator has it: the takeover
// observed, not assumed. Observed means another allocator applied
// requests, or waits for the partition's fence row lock: a process frozen
// inside its transaction holds that lock, which is what keeps the two
// apart, so applying must then wait for the thaw. (The consumer's pin id
// cannot tell: the server makes a new one at every pin, also when it pins
// the frozen process's outstanding pull again.) The unpin is
// repeated every 2s (the server may pin the frozen one's outstanding pull
// again); without a takeover within 20s it fails. It returns how long the
// takeover took and how it was seen.
func (s *stack) takeOver(ctx context.Context, frozen int) (time.Duration, string, error) {
	start := time.Now()
	// The others' totals now; the frozen one cannot answer its metrics.
	before := make(map[int]float64)
	for i, a := range s.allocs {
		if i == frozen || !a.alive() {
			continue
		}
		v, err := s.decisions(i)
		if err != nil {
			return 0, "", fmt.Errorf("%s metrics: %w", a.name, err)
		}
		before[i] = v
	}
	if len(before) == 0 {
		return 0, "", errors.New("no other allocator runs to take over")
	}
	var (
		lastUnpin time.Time
		how       string
	)
	err := poll(20*time.Second, "another allocator takes partition 0 over from the frozen "+s.allocs[frozen].name, func() (bool, error) {
		if time.Since(lastUnpin) >= 2*time.Second {
			unpinned, err := s.unpin(ctx)
			if err != nil {
				return false, err
			}
			if !unpinned {
				return false, errors.New("partition 0's consumer has no priority group: the takeover cannot be forced")
			}
			lastUnpin = time.Now()
		}
		// The frozen process runs no query: a fence lock being waited for
		// is another allocator's.
		if n, err := s.fenceLockWaits(ctx); err != nil {
			return false, err
		} else if n > 0 {
			how = "waits_for_fence_lock"
			return true, nil
		}
		for i, v := range before {
			now, err := s.decisions(i)
			if err != nil {
				return false, err
			}
			if now > v {
				how = s.allocs[i].name + "_applies"
				return true, nil
			}
		}
		return false, fmt.Errorf("no other allocator applied anything or waits for the fence since the freeze (%v)", before)
	})
	if err != nil {
		err = fmt.Errorf("%w; %s", err, s.consumerState(ctx))
	}
	return time.Since(start), how, err
}

// fenceLockWaits counts the queries on the scenario's database that are
// running the fence row lock, stuck for a second or more.
func (s *stack) fenceLockWaits(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.processlist
		WHERE db = ? AND command = 'Query' AND time >= 1 AND info LIKE '%allocator_partition%FOR UPDATE%'`, s.db.Name).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("processlist: %w", err)
	}
	return n, nil
}

// ingest503s scrapes ingest's count of write answers with status 503,
// summed over routes.
func (s *stack) ingest503s() (float64, error) {
	resp, err := s.http.Get(s.ingestURL + "/metrics")
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
		if !strings.HasPrefix(line, "allot_ingest_http_requests_total{") || !strings.Contains(line, `code="503"`) {
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

// consumerState describes partition 0's consumer, for failure messages.
func (s *stack) consumerState(ctx context.Context) string {
	c, err := s.js.Consumer(ctx, wire.RequestStream, bus.AllocatorConsumer(0))
	if err != nil {
		return "consumer: " + err.Error()
	}
	info, err := c.Info(ctx)
	if err != nil {
		return "consumer info: " + err.Error()
	}
	return fmt.Sprintf("consumer: pending %d, ack pending %d, waiting pulls %d, priority groups %+v",
		info.NumPending, info.NumAckPending, info.NumWaiting, info.PriorityGroups)
}
