package allocator

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// proc is one allocator process run by Run, whose MySQL connections go
// through a proxy of its own.
type proc struct {
	name    string
	proxy   *testenv.Proxy
	commits atomic.Int64 // batches it committed
	addr    string       // its metrics server
	stop    func()
}

// startProc runs an allocator process (Run, membership included) for the
// test's database, through a proxy, its sessions ending on the server's
// side once idle for idle (as Config.SessionDSN makes them; 0: never).
// ackWait is the redelivery timeout of a liveness test's allocators.
const ackWait = 5 * time.Second

func startProc(t *testing.T, name string, db *dbtest.DB, ns *natstest.Server, cfg Config, idle time.Duration) *proc {
	t.Helper()
	dsn, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, proxy: testenv.NewProxy(t, dsn.Addr)}
	dsn.Addr = p.proxy.Addr()
	sdsn, err := sessionDSN(dsn.FormatDSN(), idle)
	if err != nil {
		t.Fatal(err)
	}
	pdb, err := store.Open(context.Background(), sdsn, 8)
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := ns.Connect(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	cfg.MetricsAddr = p.addr
	deps := Deps{DB: pdb, NATS: nc, Log: discardLog(), MetricsListener: ln,
		Test: TestHooks{AckWait: ackWait, AfterCommit: func() error { p.commits.Add(1); return nil }}}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- Run(ctx, cfg, deps) }()
	var stopped bool
	p.stop = func() {
		if stopped {
			return
		}
		stopped = true
		p.proxy.Forward() // a stop drains the batch in hand
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("%s: Run returned %v", name, err)
		}
		pdb.Close()
		ln.Close()
	}
	t.Cleanup(p.stop)
	return p
}

// get answers the status and body of a GET on the process's metrics server.
func (p *proc) get(path string) (int, string) {
	r, err := http.Get("http://" + p.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// ownerFault is how a test cuts the partition's owner off from MySQL.
type ownerFault struct {
	name string
	cut  func(*testenv.Proxy)
	// idle is the owner's session idle limit on the server (wait_timeout).
	idle time.Duration
	// forwardOnGiveUp makes the route come back as soon as the owner gave
	// the partition up, so that what it had in flight reaches MySQL late.
	forwardOnGiveUp bool
}

// TestStalledOwnerHandsItsPartitionOver: two allocator processes, the
// partition's owner cut off from MySQL while its membership beats on: its
// route hangs (at an idle moment, or in the middle of a transaction that
// holds the fence lock, or with its COMMIT in flight), or its connections
// are refused. The peer applies the partition's requests; once the route
// is back, the old owner takes part again, nothing is applied twice, and
// the audit is clean.
func TestStalledOwnerHandsItsPartitionOver(t *testing.T) {
	t.Parallel()
	const stall = 2 * time.Second
	faults := []ownerFault{
		{name: "route hangs", cut: (*testenv.Proxy).Hang, idle: stall},
		{name: "connections refused", cut: (*testenv.Proxy).Refuse, idle: stall},
		{name: "route hangs holding the fence lock", idle: stall, cut: func(p *testenv.Proxy) {
			p.HangAfter([]byte("FROM allocator_partition WHERE partition_id = 0 FOR UPDATE"))
		}},
		// The session outlives the give-up, so the held COMMIT lands.
		{name: "commit held until the route is back", idle: time.Minute, forwardOnGiveUp: true, cut: func(p *testenv.Proxy) {
			p.HangAfter([]byte("UPDATE allocator_partition SET last_seq"))
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			stalledOwner(t, f, stall)
		})
	}
}

func stalledOwner(t *testing.T, f ownerFault, stall time.Duration) {
	db := dbtest.New(t)
	ns := natstest.New(t)
	_, js := ns.Connect(t)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js, config.Defaults[bus.Config]()); err != nil {
		t.Fatal(err)
	}
	cfg := conf(func(k *Config) { k.PinnedTTL = time.Second; k.StallTimeout = stall })
	// One after the other: two processes ensuring the same streams at
	// once trip a data race inside the embedded server.
	var procs []*proc
	for _, name := range []string{"a", "b"} {
		p := startProc(t, name, db, ns, cfg, f.idle)
		testenv.WaitFor(t, 30*time.Second, name+" ready", func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK })
		procs = append(procs, p)
	}

	var sent []wire.Request
	publish := func(rs ...wire.Request) {
		for _, r := range rs {
			natstest.PublishRequest(t, js, r, "")
			sent = append(sent, r)
		}
	}
	applied := func() int64 { return db.Count(t, "SELECT COUNT(*) FROM processed_request") }
	waitApplied := func(what string) {
		t.Helper()
		testenv.WaitFor(t, 90*time.Second, what, func() bool { return applied() >= int64(len(sent)) })
	}
	publish(open(1, 5))
	// The owner: the process that applied the last request, the same one
	// twice in a row (membership settles once both see each other).
	var owner, peer *proc
	user := int64(1)
	testenv.WaitFor(t, 60*time.Second, "one process owns the partition", func() bool {
		before := [2]int64{procs[0].commits.Load(), procs[1].commits.Load()}
		publish(req(wire.OpJoin, 1, user))
		user++
		waitApplied("a probe request applied")
		var by *proc
		for i, p := range procs {
			if p.commits.Load() > before[i] {
				by = p
			}
		}
		if by != nil && by == owner {
			return true
		}
		owner = by
		time.Sleep(time.Second)
		return false
	})
	peer = procs[0]
	if owner == procs[0] {
		peer = procs[1]
	}
	t.Logf("owner %s, peer %s", owner.name, peer.name)

	// The owner loses MySQL; its membership beats on.
	f.cut(owner.proxy)
	cut := time.Now()
	peerBefore := peer.commits.Load()
	for range 20 {
		publish(req(wire.OpJoin, 1, user), req(wire.OpClaim, 1, user+1000))
		user++
	}
	gaveUp := func() bool {
		_, body := owner.get("/metrics")
		return strings.Contains(body, `allot_allocator_partition_stalled{partition="0"} 1`)
	}
	if f.forwardOnGiveUp {
		testenv.WaitFor(t, 60*time.Second, "the owner gives the partition up", gaveUp)
		owner.proxy.Forward()
	}
	waitApplied("the peer applies the stalled owner's partition")
	t.Logf("every request applied %s after the owner was cut off (stall timeout %s, session idle limit %s)",
		time.Since(cut).Round(100*time.Millisecond), stall, f.idle)
	// (With the route back at once, the old owner may take the partition
	// back before the peer needs to apply anything.)
	if !f.forwardOnGiveUp && peer.commits.Load() == peerBefore {
		t.Fatal("every request applied, none by the peer")
	}
	if !f.forwardOnGiveUp {
		if code, body := owner.get("/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("the stalled owner's /readyz answers %d %s, want 503", code, body)
		}
		if _, body := owner.get("/metrics"); !gaveUp() || strings.Contains(body, `allot_allocator_stall_giveups_total{partition="0"} 0`) {
			t.Errorf("the stalled owner's metrics do not show the stall:\n%s", grepLines(body, "stall"))
		}
	} else if owner.proxy.Late() == 0 {
		t.Error("nothing the owner had in flight reached MySQL after the route came back")
	}

	// The route comes back: nothing is doubled, and the old owner takes
	// part again.
	owner.proxy.Forward()
	back := time.Now()
	testenv.WaitFor(t, 30*time.Second, "the old owner rejoins once it can commit", func() bool {
		code, _ := owner.get("/readyz")
		_, body := owner.get("/metrics")
		return code == http.StatusOK && strings.Contains(body, `allot_allocator_partition_stalled{partition="0"} 0`)
	})
	t.Logf("the old owner took part again %s after the route came back", time.Since(back).Round(100*time.Millisecond))
	for range 20 {
		publish(req(wire.OpCancel, 1, user-20), req(wire.OpJoin, 1, user))
		user++
	}
	waitApplied("requests applied after the route came back")
	for _, p := range procs {
		p.stop()
	}
	if n := applied(); n != int64(len(sent)) {
		t.Fatalf("%d results for %d requests", n, len(sent))
	}
	db.CheckInvariants(t)
	db.CheckEffects(t)
	rep, err := audit.Run(ctx, audit.Config{}, audit.Deps{DB: db.DB, JS: js})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		var lines []string
		for _, d := range rep.Divergences {
			lines = append(lines, d.String())
		}
		t.Fatalf("audit found %d divergences:\n%s", len(rep.Divergences), strings.Join(lines, "\n"))
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestIdlePartitionIsNotStalled: an allocator cut off from MySQL with
// nothing to apply keeps its partition, however long that lasts; the
// first request that waits makes it give the partition up, and once MySQL
// is back it applies again.
func TestIdlePartitionIsNotStalled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dsn, err := mysql.ParseDSN(e.db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, dsn.Addr)
	dsn.Addr = proxy.Addr()
	pdb, err := store.Open(context.Background(), dsn.FormatDSN(), 4)
	if err != nil {
		t.Fatal(err)
	}
	// A long pin: an idle allocator whose pin lapsed (a loaded machine)
	// no longer looks for gaps, so the stall watch would never look.
	// The ack of the request applied before the cut stays on its way
	// through the idle time (as on a loaded machine): a message applied
	// and not yet acknowledged waits for nothing.
	release := make(chan struct{})
	var released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	a, err := New(conf(func(k *Config) { k.StallTimeout = 300 * time.Millisecond; k.PinnedTTL = time.Minute }), Deps{DB: pdb, NATS: e.nc, Log: e.log, Test: TestHooks{IdleCheck: 100 * time.Millisecond, AckWait: time.Minute, BeforeConfirm: func() { <-release }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unblock(); proxy.Forward(); a.Stop(); pdb.Close() })
	opened := e.publish(open(1, 5), "")
	e.waitFence(opened)
	// Idle means delivered as well: the first batch may apply the open by
	// reading the stream before its delivery comes, and a delivery still
	// pending (NumPending) is a request the allocator cannot prove applied
	// while MySQL is away.
	testenv.WaitFor(t, 30*time.Second, "the open delivered", func() bool {
		info, err := a.cons.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.Delivered.Stream >= opened
	})

	proxy.Refuse()
	testenv.WaitFor(t, 30*time.Second, "the stall watch looks at the idle partition several times",
		func() bool { return a.stall.idleChecks.Load() >= 5 || a.stalled() })
	if a.stalled() {
		t.Fatal("an idle partition was given up")
	}
	unblock()
	last := e.publish(req(wire.OpJoin, 1, 1), "")
	testenv.WaitFor(t, 30*time.Second, "a waiting request makes the allocator give the partition up", a.stalled)
	// Counted while MySQL is still away, where no probe can end a stall:
	// one give-up, the waiting request's, none for the idle time before.
	if got := testutil.ToFloat64(a.m.giveUps); got != 1 {
		t.Fatalf("give-ups counted: %v, want 1", got)
	}

	proxy.Forward()
	testenv.WaitFor(t, 30*time.Second, "the allocator takes part again", func() bool { return !a.stalled() })
	e.waitFence(last)
	// (Not counted from here on: the first batch after the stall opens
	// new sessions and rebuilds the views, which on a loaded machine can
	// outlast this test's 300ms stall timeout, and the allocator rightly
	// gives up again until a batch commits in time.)
	t.Logf("give-ups by the time the waiting request was applied: %v", testutil.ToFloat64(a.m.giveUps))
}

// TestSessionDSN: the allocator's sessions get ALLOT_STALL_TIMEOUT as
// their idle limit, whole seconds rounded up, unless the DSN sets one;
// with the stall watch off the DSN is left alone.
func TestSessionDSN(t *testing.T) {
	const base = "u:p@tcp(db:3306)/allot?parseTime=true"
	for _, c := range []struct {
		dsn  string
		env  Config
		want string
	}{
		{base, Config{StallTimeout: 15 * time.Second}, "15"},
		{base, Config{StallTimeout: 1500 * time.Millisecond}, "2"},
		{base + "&wait_timeout=99", Config{StallTimeout: 15 * time.Second}, "99"},
		{base, Config{}, ""},
	} {
		got, err := c.env.SessionDSN(c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := mysql.ParseDSN(got)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Params["wait_timeout"] != c.want || cfg.User != "u" || cfg.Passwd != "p" || cfg.DBName != "allot" {
			t.Errorf("SessionDSN(%q) with %s = %q, want wait_timeout %q and the rest kept", c.dsn, c.env.StallTimeout, got, c.want)
		}
	}
	if _, err := (Config{StallTimeout: time.Second}).SessionDSN("not a dsn"); err == nil {
		t.Error("a bad DSN was accepted")
	}
	env := Config{Partitions: 1, PinnedTTL: time.Second, BatchSize: 1, Cache: 1, StallTimeout: 100 * time.Millisecond}
	if err := env.Validate(); err == nil || !strings.Contains(err.Error(), "ALLOT_STALL_TIMEOUT") {
		t.Errorf("ALLOT_STALL_TIMEOUT=100ms: %v, want it refused", err)
	}
}
