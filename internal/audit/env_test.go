package audit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/store/checkpoint"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// env is one test's real MariaDB database, JetStream server and allocator.
type env struct {
	t     testing.TB
	db    *dbtest.DB
	ns    *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	alloc *allocator.Allocator
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{t: t, db: dbtest.New(t), ns: natstest.New(t)}
	e.nc, e.js = e.ns.Connect(t)
	if err := bus.EnsureStreams(context.Background(), e.js, config.Defaults[bus.Config]()); err != nil {
		t.Fatal(err)
	}
	return e
}

// startAllocator runs a real allocator until stopAllocator or the test ends.
func (e *env) startAllocator() {
	e.t.Helper()
	a, err := allocator.New(config.Defaults[allocator.Config](), allocator.Deps{DB: e.db.DB, NATS: e.nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.alloc = a
	e.t.Cleanup(a.Stop)
}

func (e *env) stopAllocator() { e.alloc.Stop() }

func newReq(op wire.Op, activity, user int64) wire.Request {
	return wire.Request{RequestID: uuid.Must(uuid.NewV7()).String(), Op: op, ActivityID: activity, UserID: user, ReceivedAt: time.Now().UTC()}
}

func openReq(activity, capacity int64) wire.Request {
	r := newReq(wire.OpOpen, activity, 0)
	r.Capacity = &capacity
	return r
}

// publish stores r with Nats-Msg-Id msgID (request_id when empty).
func (e *env) publish(r wire.Request, msgID string) uint64 {
	e.t.Helper()
	return natstest.PublishRequest(e.t, e.js, r, msgID)
}

func (e *env) publishRaw(subject, data string) uint64 {
	e.t.Helper()
	ack, err := e.js.Publish(context.Background(), subject, []byte(data))
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

// publishAll stores reqs in order with asynchronous publishes and returns
// their stream sequences.
func (e *env) publishAll(reqs []wire.Request) []uint64 {
	e.t.Helper()
	js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		e.t.Fatal(err)
	}
	futures := make([]jetstream.PubAckFuture, len(reqs))
	for i, r := range reqs {
		b, err := json.Marshal(r)
		if err != nil {
			e.t.Fatal(err)
		}
		// One subject per activity keeps the broker's order per subject;
		// the stream order across subjects is the order of the acks.
		futures[i], err = js.PublishAsync(wire.RequestSubject(r.ActivityID), b, jetstream.WithMsgID(r.RequestID))
		if err != nil {
			e.t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		e.t.Fatal("async publishes not acknowledged within a minute")
	}
	seqs := make([]uint64, len(reqs))
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			seqs[i] = ack.Sequence
		case err := <-f.Err():
			e.t.Fatalf("publish %d: %v", i, err)
		}
	}
	return seqs
}

// waitCheckpoint waits up to a minute until partition's newest checkpoint
// is at fence, and returns it.
func (e *env) waitCheckpoint(t testing.TB, partition int, fence uint64) checkpoint.Checkpoint {
	t.Helper()
	var cp checkpoint.Checkpoint
	testenv.WaitFor(t, time.Minute, fmt.Sprintf("partition %d checkpointed at its fence %d", partition, fence), func() bool {
		var ok bool
		var err error
		cp, ok, err = checkpoint.Latest(context.Background(), e.db.DB, partition)
		if err != nil {
			t.Fatal(err)
		}
		return ok && cp.Seq == fence
	})
	return cp
}

// waitFence waits until the allocator's fence reaches seq.
func (e *env) waitFence(seq uint64) {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var last uint64
		err := e.db.QueryRow("SELECT COALESCE(MAX(last_seq), 0) FROM allocator_partition").Scan(&last)
		if err == nil && last >= seq {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("fence did not reach %d within 2m (at %d, err %v)", seq, last, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// audit runs the audit in-process.
func (e *env) audit(cfg audit.Config) audit.Report {
	e.t.Helper()
	return e.auditDeps(cfg, audit.Deps{})
}

// auditDeps is audit with deps, whose DB and JS are the env's.
func (e *env) auditDeps(cfg audit.Config, deps audit.Deps) audit.Report {
	e.t.Helper()
	deps.DB, deps.JS = e.db.DB, e.js
	rep, err := audit.Run(context.Background(), cfg, deps)
	if err != nil {
		e.t.Fatalf("audit.Run(%+v): %v", cfg, err)
	}
	return rep
}

func (e *env) exec(query string, args ...any) {
	e.t.Helper()
	if _, err := e.db.Exec(query, args...); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
}

// queryStrings returns the one string column of query's rows, in order.
func (e *env) queryStrings(query string, args ...any) []string {
	e.t.Helper()
	rows, err := e.db.Query(query, args...)
	if err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			e.t.Fatalf("%s: %v", query, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return out
}

// burst is a deterministic mix of every op over activities 1..activities
// and users 1..users: opens first, then joins, cancels, claims and resizes.
// Small capacities and few users make every outcome occur.
func burst(n, activities int, capacity int64, users int, seed uint64) []wire.Request {
	out := make([]wire.Request, 0, n+activities)
	for a := int64(1); a <= int64(activities); a++ {
		out = append(out, openReq(a, capacity))
	}
	x := seed | 1
	next := func() uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x }
	for len(out) < cap(out) {
		a := int64(next()%uint64(activities)) + 1
		u := int64(next()%uint64(users)) + 1
		switch k := next() % 40; {
		case k < 16:
			out = append(out, newReq(wire.OpJoin, a, u))
		case k < 27:
			out = append(out, newReq(wire.OpCancel, a, u))
		case k < 38:
			out = append(out, newReq(wire.OpClaim, a, u))
		default:
			out = append(out, openReq(a, capacity/2+int64(next()%uint64(capacity))))
		}
	}
	return out
}

// divergences formats ds one a line, for failure messages.
func divergences(ds []audit.Divergence) string {
	s := ""
	for _, d := range ds {
		s += "\n  " + d.String()
	}
	return s
}

// tamperCase is one change made to MySQL behind the allocator's back, the
// statements that undo it, and the one divergence the audit must report.
type tamperCase struct {
	name            string
	tamper, restore []string
	want            audit.Divergence
}

// auditTampered applies tc.tamper, audits, applies tc.restore and fails t
// unless the audit reported exactly one divergence, equal to tc.want apart
// from Detail. It returns the report and that divergence, Detail cleared.
func (e *env) auditTampered(t testing.TB, tc tamperCase) (audit.Report, audit.Divergence) {
	t.Helper()
	for _, q := range tc.tamper {
		e.exec(q)
	}
	rep := e.audit(audit.Config{})
	for _, q := range tc.restore {
		e.exec(q)
	}
	if rep.OK || len(rep.Divergences) != 1 {
		t.Fatalf("want exactly one divergence, got %d:%s", len(rep.Divergences), divergences(rep.Divergences))
	}
	got := rep.Divergences[0]
	got.Detail = ""
	if got != tc.want {
		t.Fatalf("divergence = %+v\nwant %+v", got, tc.want)
	}
	return rep, got
}
