package ingest

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/devdb"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// shardHarness is an ingest over two private MariaDB servers, shards s0
// and s1, with the map seeded (partition p on s<p mod 2>) and no
// allocator: the tests write the rows an allocator would, on the shard
// they mean.
type shardHarness struct {
	*harness
	procs []*devdb.DB
	dbs   []*dbtest.DB
	parts int
}

func newShardHarness(t *testing.T, partitions int) *shardHarness {
	t.Helper()
	sh := &shardHarness{harness: &harness{t: t, ns: natstest.New(t), reg: prometheus.NewRegistry()}, parts: partitions}
	sh.procs = dbtest.ServerProcs(t, 2)
	pools := shards.Pools{}
	for i, p := range sh.procs {
		db := dbtest.NewOn(t, p.DSN)
		sh.dbs = append(sh.dbs, db)
		// Ingest's own pool, as cmd/ingest opens it.
		pool, err := store.Open(context.Background(), db.DSN, 8)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pool.Close() })
		pools[fmt.Sprintf("s%d", i)] = pool
	}
	sh.ns.Setup(t, natstest.Config(partitions), "s0", "s1")
	sh.nc, sh.js = sh.ns.Connect(t)
	svc := newService(t, nil, sh.nc, sh.js, sh.reg, func(c *Config, d *Deps) {
		c.Partitions = partitions
		d.DB, d.Shards = nil, pools
		d.Test.QueryTimeout = 2 * time.Second
	})
	if err := svc.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(svc.Stop)
	sh.svc = svc
	sh.srv = httptest.NewServer(svc.Handler())
	t.Cleanup(sh.srv.Close)
	sh.cl = &http.Client{Timeout: 60 * time.Second}
	return sh
}

// activityOn is an activity from from whose partition the seed puts on
// shard i.
func (sh *shardHarness) activityOn(i int, from int64) int64 {
	for a := from; ; a++ {
		if bus.PartitionOf(a, sh.parts)%2 == i {
			return a
		}
	}
}

func (sh *shardHarness) exec(i int, query string, args ...any) {
	sh.t.Helper()
	if _, err := sh.dbs[i].ExecContext(context.Background(), query, args...); err != nil {
		sh.t.Fatalf("s%d: %s: %v", i, query, err)
	}
}

// result records a done result of id on shard i, as the allocator would.
func (sh *shardHarness) result(i int, id string, activity, user int64) {
	sh.t.Helper()
	sh.exec(i, "INSERT INTO processed_request (request_id, seq, op, activity_id, user_id, outcome, status, applied_at) VALUES (?,?,?,?,?,?,?,?)",
		id, seqs.Add(1), wire.OpJoin, activity, user, wire.OutcomeConfirmed, wire.StatusConfirmed, time.Now().UTC())
}

// mint is a request id ingest issues for user's request in activity.
func (sh *shardHarness) mint(activity, user int64) string {
	id, err := sh.svc.callers.ids.New(user, bus.PartitionOf(activity, sh.parts), sh.parts)
	if err != nil {
		sh.t.Fatal(err)
	}
	return id.String()
}

// capacityOf is GET /v1/activities/a's capacity, or -status when it is
// not 200.
func (sh *shardHarness) capacityOf(a int64) int64 {
	resp, body := sh.do(req{method: http.MethodGet, path: "/v1/activities/" + strconv.FormatInt(a, 10)})
	if resp.StatusCode != http.StatusOK {
		return -int64(resp.StatusCode)
	}
	return decode[store.ActivityState](sh.t, "activity", body).Capacity
}

// shardDown checks a 503 naming shard with Retry-After.
func shardDown(t *testing.T, what string, resp *http.Response, body []byte, shard string) {
	t.Helper()
	wantStatus(t, what, resp, body, http.StatusServiceUnavailable)
	if msg := errorSentence(t, what, resp, body); !strings.Contains(msg, "shard "+shard+" ") {
		t.Errorf("%s: %q does not name shard %s", what, msg, shard)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Errorf("%s: 503 without Retry-After", what)
	}
}

// TestReadsGoToTheActivitysShard: with two shards, state, signup and
// result reads go to the shard of the activity's partition (rows are
// only there), a poll to the shard its id names, an id that names none
// to every shard. With s1 killed, s0's activities still answer and s1's
// answer 503 naming s1 (with Retry-After), writes for them still 202,
// /readyz stays 200 listing s1 down, and the metrics say so; restarted,
// s1 answers again. A partition the map moves is read on its new shard.
func TestReadsGoToTheActivitysShard(t *testing.T) {
	sh := newShardHarness(t, 4)
	a0, a1 := sh.activityOn(0, 100), sh.activityOn(1, 100)
	sh.exec(0, "INSERT INTO activity (id, capacity, confirmed_count) VALUES (?, 10, 1)", a0)
	sh.exec(0, "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (?, 7, 'CONFIRMED', 1)", a0)
	sh.exec(1, "INSERT INTO activity (id, capacity, confirmed_count) VALUES (?, 20, 1)", a1)
	sh.exec(1, "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (?, 8, 'CONFIRMED', 1)", a1)
	id0, id1 := sh.mint(a0, 7), sh.mint(a1, 8)
	sh.result(0, id0, a0, 7)
	sh.result(1, id1, a1, 8)
	// Ids ingest did not mint name no partition: asked of every shard.
	foreign, nowhere := uuid.NewString(), uuid.NewString()
	sh.result(0, foreign, a0, 7)

	get := func(path string) (*http.Response, []byte) { return sh.do(req{method: http.MethodGet, path: path}) }
	act := func(a int64) string { return "/v1/activities/" + strconv.FormatInt(a, 10) }
	signup := func(a, u int64) string { return act(a) + "/signups/" + strconv.FormatInt(u, 10) }
	if c0, c1 := sh.capacityOf(a0), sh.capacityOf(a1); c0 != 10 || c1 != 20 {
		t.Fatalf("capacities %d (on s0) and %d (on s1), want 10 and 20", c0, c1)
	}
	for _, p := range []string{signup(a0, 7), signup(a1, 8), "/v1/requests/" + id0, "/v1/requests/" + id1, "/v1/requests/" + foreign} {
		resp, body := get(p)
		wantStatus(t, "GET "+p, resp, body, http.StatusOK)
	}
	resp, body := get("/v1/requests/" + nowhere)
	wantStatus(t, "poll of an id no shard holds", resp, body, http.StatusNotFound)

	keyed := req{method: http.MethodPost, path: signup(a1, 10), header: map[string]string{"Idempotency-Key": "k-s1"}}
	resp, body = sh.do(keyed)
	keyedID := accepted(t, "keyed join on s1", resp, body)

	if err := sh.procs[1].Kill(); err != nil {
		t.Fatal(err)
	}
	// A repeat of a key reads its request's result, and goes on without.
	resp, body = sh.do(keyed)
	if id := accepted(t, "repeat of a keyed join on s1 while it is down", resp, body); id != keyedID {
		t.Errorf("repeat of a keyed join: id %s, want the first's %s", id, keyedID)
	}
	// s0's activities answer as before: none of their reads waits on s1.
	if c := sh.capacityOf(a0); c != 10 {
		t.Fatalf("activity %d on s0 with s1 killed: %d", a0, c)
	}
	for _, p := range []string{signup(a0, 7), "/v1/requests/" + id0, "/v1/requests/" + foreign} {
		resp, body := get(p)
		wantStatus(t, "GET "+p+" with s1 killed", resp, body, http.StatusOK)
	}
	// A poll reads the one shard its id names: a pending id of s0's
	// partition is pending, not a 503 for want of s1.
	resp, body = get("/v1/requests/" + sh.mint(a0, 7))
	wantStatus(t, "poll of a pending id of s0's partition with s1 killed", resp, body, http.StatusOK)
	if decode[wire.Ack](t, "poll", body).State != wire.StatePending {
		t.Errorf("poll of a pending id on s0: %s, want pending", body)
	}
	// s1's answer 503 naming it.
	for _, p := range []string{act(a1), signup(a1, 8), "/v1/requests/" + id1, "/v1/requests/" + nowhere} {
		resp, body := get(p)
		shardDown(t, "GET "+p+" with s1 killed", resp, body, "s1")
	}
	// Writes never read MySQL.
	resp, body = sh.do(req{method: http.MethodPost, path: signup(a1, 9)})
	newID := accepted(t, "join on s1 while it is down", resp, body)
	resp, body = get("/readyz")
	wantStatus(t, "/readyz with s1 killed", resp, body, http.StatusOK)
	if !strings.Contains(string(body), `"s0":"up"`) || !strings.Contains(string(body), `"s1":"down"`) {
		t.Errorf("/readyz with s1 killed: %s, want s0 up and s1 down", body)
	}
	resp, body = get("/metrics")
	for _, want := range []string{`allot_ingest_shard_up{shard="s0"} 1`, `allot_ingest_shard_up{shard="s1"} 0`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics with s1 killed lacks %s", want)
		}
	}
	if !strings.Contains(string(body), `allot_ingest_shard_read_errors_total{shard="s0"} 0`+"\n") ||
		strings.Contains(string(body), `allot_ingest_shard_read_errors_total{shard="s1"} 0`+"\n") {
		t.Errorf("/metrics read errors, want some of s1 only:\n%s", grep(string(body), "shard_read_errors"))
	}
	// A pending poll of s1's new request: its shard is down.
	resp, body = get("/v1/requests/" + newID)
	shardDown(t, "poll of a request pending on s1", resp, body, "s1")

	if err := sh.procs[1].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "s1's activity answers after the restart", func() bool { return sh.capacityOf(a1) == 20 })
	resp, body = get("/v1/requests/" + newID)
	wantStatus(t, "poll of a request pending on s1 after the restart", resp, body, http.StatusOK)
	if decode[wire.Ack](t, "poll", body).State != wire.StatePending {
		t.Errorf("poll after the restart: %s, want pending", body)
	}
	eventually(t, 10*time.Second, "/readyz lists s1 up", func() bool {
		_, body := get("/readyz")
		return strings.Contains(string(body), `"s1":"up"`)
	})

	// The map moves a0's partition to s1 (its state copied there first,
	// here with another capacity to tell the copies apart): reads follow.
	p0 := bus.PartitionOf(a0, sh.parts)
	sh.exec(1, "INSERT INTO activity (id, capacity, confirmed_count) VALUES (?, 11, 1)", a0)
	kv, err := sh.js.KeyValue(context.Background(), shards.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	places, err := shards.Read(context.Background(), kv)
	if err != nil {
		t.Fatal(err)
	}
	var rev uint64
	for _, pl := range places {
		if pl.Partition == p0 {
			rev = pl.Revision
		}
	}
	if _, err := shards.Update(context.Background(), kv, p0, shards.Entry{Shard: "s1", Epoch: 2}, rev); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a0 read on s1 once the map moves its partition", func() bool { return sh.capacityOf(a0) == 11 })
}

// grep is the lines of s that hold sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestNoShardAnswers: with several shards and none answering, /readyz
// answers 503 naming them; a read whose partition the map puts on a shard
// this ingest does not know answers 503 saying so.
func TestNoShardAnswers(t *testing.T) {
	away := func() *sql.DB {
		db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/allot?timeout=1s") // nothing listens on port 1
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	// The harness seeds the map with the one shard "default".
	h := newHarnessWith(t, nil, away(), func(_ *Config, d *Deps) {
		d.Shards = shards.Pools{"s0": away(), "s1": away()}
	})
	resp, body := h.do(req{method: http.MethodGet, path: "/readyz"})
	wantStatus(t, "/readyz with no shard answering", resp, body, http.StatusServiceUnavailable)
	if msg := errorSentence(t, "/readyz", resp, body); !strings.Contains(msg, "s0, s1") {
		t.Errorf("/readyz says %q, want s0 and s1 named", msg)
	}
	resp, body = h.do(req{method: http.MethodGet, path: "/v1/activities/1"})
	wantStatus(t, "read of an activity the map puts on an unknown shard", resp, body, http.StatusServiceUnavailable)
	if msg := errorSentence(t, "read", resp, body); !strings.Contains(msg, "shard map") {
		t.Errorf("read says %q, want the shard map named", msg)
	}
}
