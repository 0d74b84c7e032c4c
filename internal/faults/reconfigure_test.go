package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/wire"
)

// runtimeRoles are the users of accounts.conf that run allot's binaries;
// none of them may create or change a stream or bucket.
var runtimeRoles = []string{"ingest", "allocator", "notifier", "audit"}

// permStack starts the real nats-server on deploy/nats/accounts.conf
// alone, with the test's admin connection.
func permStack(t *testing.T) (*stack, jetstream.JetStream) {
	t.Helper()
	needSuite(t)
	s := &stack{t: t}
	s.must(s.startNATSWithPermissions())
	nc, err := bus.Connect(s.roleURL("admin"), "faults-admin", slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.must(err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	s.must(err)
	s.nc, s.js = nc, js
	return s, js
}

// connectAs connects as role with the role's inbox prefix, recording the
// permissions violations the server reports.
func connectAs(t *testing.T, s *stack, role string) (*nats.Conn, jetstream.JetStream, *violations) {
	t.Helper()
	v := &violations{}
	nc, err := bus.Connect(s.roleURL(role), role, slog.New(slog.NewTextHandler(io.Discard, nil)), nats.ErrorHandler(v.handler))
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, v
}

// waitViolation waits for the server's report of a permissions violation
// on subject; false when none came.
func waitViolation(v *violations, subject string) bool {
	return poll(10*time.Second, "violation", func() (bool, error) { return v.about(subject), nil }) == nil
}

// TestScenario11RolesCannotReconfigure: on the real accounts.conf, no
// runtime role may create a stream or bucket (before the setup step), nor
// change one after it: ALLOT_REQUESTS updated to max_age 1s and discard
// old would empty the request log within seconds. Each attempt must be
// refused by the server (a permissions violation on the JetStream API
// subject), and every stream keeps its configuration and every message.
func TestScenario11RolesCannotReconfigure(t *testing.T) {
	s, admin := permStack(t)
	ctx := context.Background()
	streams := []jetstream.StreamConfig{
		bus.HoldStreamConfig(1), config.Defaults[bus.Config]().RequestStream(),
		config.Defaults[bus.Config]().EventStream(), bus.DLQStreamConfig(1),
	}
	buckets := []jetstream.KeyValueConfig{
		bus.IdempotencyBucketConfig(1), bus.ViewBucketConfig(1), bus.MembersBucketConfig(1, bus.MembersTTL),
		bus.ShardsBucketConfig(1),
	}
	type attempt struct {
		role, what, subject string
		try                 func(ctx context.Context, js jetstream.JetStream) error
	}
	// attemptAll runs each role's attempts in turn, a role's attempts
	// concurrently (each waits out its short deadline: a refused request
	// gets no answer), then restore puts back what an accepted one
	// changed, so that the next role is tried on the same ground.
	attemptAll := func(build func(role string) []attempt, effect func(a attempt) error, restore func()) {
		for _, role := range runtimeRoles {
			_, js, v := connectAs(t, s, role)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var fails []string
			for _, a := range build(role) {
				wg.Go(func() {
					actx, cancel := context.WithTimeout(ctx, time.Second)
					aerr := a.try(actx, js)
					cancel()
					var fail string
					if err := effect(a); err != nil {
						fail = fmt.Sprintf("as %s: %s: %v (attempt answered %v)", role, a.what, err, aerr)
					} else if !waitViolation(v, a.subject) {
						fail = fmt.Sprintf("as %s: %s: no permissions violation for %s (attempt answered %v)", role, a.what, a.subject, aerr)
					}
					if fail != "" {
						mu.Lock()
						fails = append(fails, fail)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			for _, f := range fails {
				t.Error(f)
			}
			if len(fails) > 0 {
				restore()
			}
		}
	}

	// Before the setup step: nothing exists, and no role may create it.
	attemptAll(func(role string) []attempt {
		var out []attempt
		for _, sc := range streams {
			out = append(out, attempt{role, "create stream " + sc.Name, "$JS.API.STREAM.CREATE." + sc.Name,
				func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.CreateStream(ctx, sc)
					return err
				}})
		}
		for _, kc := range buckets {
			out = append(out, attempt{role, "create bucket " + kc.Bucket, "$JS.API.STREAM.CREATE." + bus.KeyValueStream(kc.Bucket),
				func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.CreateKeyValue(ctx, kc)
					return err
				}})
		}
		return out
	}, func(a attempt) error {
		name := strings.TrimPrefix(a.subject, "$JS.API.STREAM.CREATE.")
		if _, err := admin.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("%s exists after the attempt (lookup: %v)", name, err)
		}
		return nil
	}, func() {
		for name := range admin.StreamNames(ctx).Name() {
			admin.DeleteStream(ctx, name) //nolint:errcheck // the next role starts from nothing again
		}
	})

	// The setup step, as its own user, then messages in every stream.
	_, setupJS, setupV := connectAs(t, s, "allotctl")
	if _, err := bus.Setup(ctx, setupJS, natstest.Config(2), nil); err != nil {
		t.Fatalf("setup as allotctl: %v", err)
	}
	// That user may set streams up, and no more: not delete one.
	dctx, dcancel := context.WithTimeout(ctx, time.Second)
	derr := setupJS.DeleteStream(dctx, wire.RequestStream)
	dcancel()
	if _, err := admin.Stream(ctx, wire.RequestStream); err != nil || !waitViolation(setupV, "$JS.API.STREAM.DELETE."+wire.RequestStream) {
		t.Errorf("as allotctl: delete %s was not refused (attempt answered %v; lookup %v)", wire.RequestStream, derr, err)
	}
	names := []string{}
	for _, sc := range streams {
		names = append(names, sc.Name)
	}
	for _, kc := range buckets {
		names = append(names, bus.KeyValueStream(kc.Bucket))
	}
	before := map[string]*jetstream.StreamInfo{}
	// fill sets the streams up as admin (again, after an accepted change)
	// and stores messages in every one, then notes their state.
	fill := func() {
		for _, name := range names {
			if b := before[name]; b != nil {
				if _, err := admin.UpdateStream(ctx, b.Config); err != nil {
					t.Fatalf("restore %s as admin: %v", name, err)
				}
			}
		}
		const n = 50
		for i := range n {
			for _, subj := range []string{wire.RequestSubject(int64(i + 1)), wire.EventSubjectPrefix + "1.confirmed", "alloc.dlq.notify", wire.HoldSubjectPrefix + "at.1"} {
				if _, err := admin.Publish(ctx, subj, []byte(`{}`)); err != nil {
					t.Fatalf("publish %s as admin: %v", subj, err)
				}
			}
		}
		kv, err := admin.KeyValue(ctx, wire.ViewBucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "1", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			st, err := admin.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			before[name] = st.CachedInfo()
		}
	}
	fill()

	// No role may change what the setup step made.
	attemptAll(func(role string) []attempt {
		var out []attempt
		for _, name := range names {
			cfg := before[name].Config
			cfg.MaxAge, cfg.Discard = time.Second, jetstream.DiscardOld
			cfg.Duplicates = time.Second
			out = append(out, attempt{role, "update stream " + name + " to max_age 1s, discard old", "$JS.API.STREAM.UPDATE." + name,
				func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.UpdateStream(ctx, cfg)
					return err
				}})
		}
		for _, kc := range buckets {
			kc.TTL = time.Second
			out = append(out, attempt{role, "update bucket " + kc.Bucket + " to ttl 1s", "$JS.API.STREAM.UPDATE." + bus.KeyValueStream(kc.Bucket),
				func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.UpdateKeyValue(ctx, kc)
					return err
				}})
		}
		return out
	}, func(a attempt) error {
		name := strings.TrimPrefix(a.subject, "$JS.API.STREAM.UPDATE.")
		st, err := admin.Stream(ctx, name)
		if err != nil {
			return err
		}
		info := st.CachedInfo()
		if !reflect.DeepEqual(info.Config, before[name].Config) {
			// Show what the change does: the stream empties.
			emptied := poll(10*time.Second, name+" emptied", func() (bool, error) {
				i, err := st.Info(ctx)
				return err == nil && i.State.Msgs == 0, nil
			}) == nil
			return fmt.Errorf("accepted: %s now has max_age %s, discard %s (emptied within 10s: %t, %d messages before)",
				name, info.Config.MaxAge, info.Config.Discard, emptied, before[name].State.Msgs)
		}
		if info.State.Msgs != before[name].State.Msgs {
			return fmt.Errorf("%s holds %d messages, had %d", name, info.State.Msgs, before[name].State.Msgs)
		}
		return nil
	}, fill)
	// No role may write the shard map (the setup step seeded p.0 and p.1).
	mapStream := bus.KeyValueStream(bus.ShardsBucket)
	// ... but ingest, the allocator and audit read and watch it.
	for _, role := range []string{"ingest", "allocator", "audit"} {
		_, js, _ := connectAs(t, s, role)
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		kv, err := bus.CheckBucket(wctx, js, bus.ShardsBucketConfig(1))
		var m *shards.Map
		if err == nil {
			m, err = shards.Watch(wctx, kv)
		}
		if err != nil || m.Shard(1) != shards.DefaultName {
			t.Errorf("as %s: watch %s: %v", role, bus.ShardsBucket, err)
		}
		wcancel()
	}
	attemptAll(func(role string) []attempt {
		return []attempt{{role, "move partition 0 in " + bus.ShardsBucket, "$KV." + bus.ShardsBucket + ".p.0",
			func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.Publish(ctx, "$KV."+bus.ShardsBucket+".p.0", []byte(`{"shard":"x","epoch":2}`))
				return err
			}}}
	}, func(a attempt) error {
		info, err := mustStream(ctx, admin, mapStream)
		if err != nil {
			return err
		}
		if info.State.Msgs != before[mapStream].State.Msgs {
			return fmt.Errorf("%s holds %d entries, had %d", bus.ShardsBucket, info.State.Msgs, before[mapStream].State.Msgs)
		}
		return nil
	}, func() {})
	// Every message is still there once every attempt is over.
	for _, name := range names {
		info, err := mustStream(ctx, admin, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != before[name].State.Msgs || info.State.FirstSeq != before[name].State.FirstSeq {
			t.Errorf("%s: %d messages from seq %d, had %d from %d", name, info.State.Msgs, info.State.FirstSeq, before[name].State.Msgs, before[name].State.FirstSeq)
		}
	}
}

func mustStream(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return st.Info(ctx)
}

// TestScenario11InboxesPerRole: each role's replies (PubAcks, pulled
// requests, KV reads) arrive under its own inbox prefix, and no role may
// subscribe to the shared _INBOX.> nor to another role's prefix. Each
// forbidden subscription must be reported as a permissions violation and
// receive nothing of what admin publishes there, while a message admin
// publishes after it to the role's own inbox does arrive.
func TestScenario11InboxesPerRole(t *testing.T) {
	s, _ := permStack(t)
	roles := append(slices.Clone(runtimeRoles), "allotctl")
	for i, role := range roles {
		other := roles[(i+1)%len(roles)]
		nc, js, v := connectAs(t, s, role)
		// The role's own replies work: a JetStream API request answers.
		if _, err := js.AccountInfo(context.Background()); err != nil {
			t.Errorf("as %s: account info through its inbox %s: %v", role, bus.InboxPrefix(role), err)
		}
		own, err := nc.SubscribeSync(bus.InboxPrefix(role) + ".probe")
		if err != nil {
			t.Fatal(err)
		}
		for _, forbidden := range []string{"_INBOX.>", bus.InboxPrefix(other) + ".>"} {
			sub, err := nc.SubscribeSync(forbidden)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			target := strings.TrimSuffix(forbidden, ">") + "probe"
			if err := s.nc.Publish(target, []byte("secret")); err != nil {
				t.Fatal(err)
			}
			if err := s.nc.Publish(bus.InboxPrefix(role)+".probe", []byte("control")); err != nil {
				t.Fatal(err)
			}
			if err := s.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if _, err := own.NextMsg(10 * time.Second); err != nil {
				t.Errorf("as %s: its own inbox got nothing: %v", role, err)
			}
			// The secret was published first: had the subscription been
			// allowed, it would be queued by now.
			if m, err := sub.NextMsg(time.Millisecond); err == nil {
				t.Errorf("as %s: a subscription to %s received %q published on %s", role, forbidden, m.Data, m.Subject)
			}
			if !waitViolation(v, forbidden) {
				t.Errorf("as %s: subscribing to %s was not refused", role, forbidden)
			}
			sub.Unsubscribe() //nolint:errcheck
		}
	}
}

// TestScenario11BinariesNeedSetup: a runtime binary that finds a stream it
// needs missing, or not configured as allot sets it up, or with another
// number of partitions, exits 2 with one line saying so (it never creates
// or repairs it, and never waits for it), each connected as its own user.
func TestScenario11BinariesNeedSetup(t *testing.T) {
	s, admin := permStack(t)
	ctx := context.Background()
	db := dbtest.New(t)
	common := []string{"ALLOT_MYSQL_DSN=" + db.DSN, "ALLOT_LOG_LEVEL=info"}
	// exits2 runs binary as its role until it exits and requires exit 2
	// and exactly one line with want in it.
	exits2 := func(binary string, want string, env ...string) {
		t.Helper()
		env = append(append(slices.Clone(common), "ALLOT_NATS_URL="+s.roleURL(binary),
			"ALLOT_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(freePort(t)), "ALLOT_METRICS_ADDR=127.0.0.1:"+strconv.Itoa(freePort(t))), env...)
		p := newProc(t, binary, binary, env)
		inc, err := p.start()
		if err != nil {
			t.Fatal(err)
		}
		if err := poll(time.Minute, binary+" exits", func() (bool, error) { return !inc.alive(), nil }); err != nil {
			p.kill() //nolint:errcheck
			t.Errorf("%s facing %q: still running after a minute; want exit 2", binary, want)
			return
		}
		var lines []string
		for line := range strings.Lines(inc.output.String()) {
			if strings.Contains(line, want) {
				lines = append(lines, strings.TrimSpace(line))
			}
		}
		if inc.exitText() != "exit status 2" || len(lines) != 1 || !strings.HasPrefix(lines[0], binary+": ") {
			t.Errorf("%s: %s with %d lines saying %q; want exit status 2 and one line", binary, inc.exitText(), len(lines), want)
			return
		}
		t.Logf("%s: %s", inc.exitText(), lines[0])
	}

	exits2("ingest", "stream ALLOT_REQUESTS does not exist: run `allotctl setup`")
	exits2("allocator", "stream ALLOT_REQUESTS does not exist: run `allotctl setup`")
	exits2("notifier", "stream ALLOT_EVENTS does not exist: run `allotctl setup`")
	for _, name := range []string{wire.RequestStream, wire.EventStream} {
		if _, err := admin.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("%s exists after the binaries ran before the setup step (%v)", name, err)
		}
	}

	_, setupJS, _ := connectAs(t, s, "allotctl")
	if _, err := bus.Setup(ctx, setupJS, natstest.Config(2), nil); err != nil {
		t.Fatal(err)
	}
	exits2("ingest", "another number of partitions", "ALLOT_PARTITIONS=1")

	st, err := admin.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Discard = jetstream.DiscardOld
	if _, err := admin.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	exits2("allocator", "stream ALLOT_REQUESTS is not as allot sets it up (Discard DiscardOld, want DiscardNew): run `allotctl setup`", "ALLOT_PARTITIONS=2")
	exits2("ingest", "stream ALLOT_REQUESTS is not as allot sets it up", "ALLOT_PARTITIONS=2")

	if err := admin.DeleteStream(ctx, bus.DLQStream); err != nil {
		t.Fatal(err)
	}
	exits2("notifier", "stream ALLOT_DLQ does not exist: run `allotctl setup`")
	if _, err := bus.Setup(ctx, setupJS, natstest.Config(2), nil); err != nil { // repairs ALLOT_REQUESTS, recreates ALLOT_DLQ
		t.Fatal(err)
	}
	if err := admin.DeleteKeyValue(ctx, bus.MembersBucket); err != nil {
		t.Fatal(err)
	}
	exits2("allocator", "bucket ALLOT_ALLOCATORS does not exist: run `allotctl setup`", "ALLOT_PARTITIONS=2")
}
