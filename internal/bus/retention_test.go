package bus_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

func streamConfig(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	st, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return st.CachedInfo().Config
}

// TestStreamsRetention: the streams are created with the configured
// bounds (the request stream refusing new requests when full, the event
// stream dropping its oldest), a binary that does not own the setting keeps
// them, and a changed setting updates the existing streams.
func TestStreamsRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := natstest.New(t).Connect(t)

	// The request stream as allot created it before retention existed:
	// no limits, the oldest discarded first.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.RequestStream, Subjects: []string{wire.RequestSubjectPrefix + ">"},
		Storage: jetstream.FileStorage, Discard: jetstream.DiscardOld, Duplicates: 2 * time.Minute, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	env := bus.RetentionEnv{RequestsMaxAge: 48 * time.Hour, RequestsMaxBytes: 64 << 20, EventsMaxAge: 24 * time.Hour, EventsMaxBytes: 32 << 20}
	if err := bus.EnsureStreams(ctx, js, env.Apply(bus.StreamConfig{})); err != nil {
		t.Fatal(err)
	}
	check := func(when string, reqAge time.Duration, reqBytes int64, evtAge time.Duration, evtBytes int64) {
		t.Helper()
		r := streamConfig(t, js, wire.RequestStream)
		if r.MaxAge != reqAge || r.MaxBytes != reqBytes || r.Discard != jetstream.DiscardNew {
			t.Errorf("%s: %s max_age %s max_bytes %d discard %s, want %s, %d, new", when, wire.RequestStream, r.MaxAge, r.MaxBytes, r.Discard, reqAge, reqBytes)
		}
		if r.Duplicates > r.MaxAge && r.MaxAge > 0 {
			t.Errorf("%s: duplicate window %s beyond max age %s", when, r.Duplicates, r.MaxAge)
		}
		e := streamConfig(t, js, wire.EventStream)
		if e.MaxAge != evtAge || e.MaxBytes != evtBytes || e.Discard != jetstream.DiscardOld {
			t.Errorf("%s: %s max_age %s max_bytes %d discard %s, want %s, %d, old", when, wire.EventStream, e.MaxAge, e.MaxBytes, e.Discard, evtAge, evtBytes)
		}
	}
	check("updated from before retention, and created", 48*time.Hour, 64<<20, 24*time.Hour, 32<<20)

	// A setup without retention settings (the tests) keeps what exists.
	if err := bus.EnsureStreams(ctx, js, bus.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	check("ensured without a setting", 48*time.Hour, 64<<20, 24*time.Hour, 32<<20)

	// 0 means no limit; a short age shrinks the duplicate window with it.
	env = bus.RetentionEnv{RequestsMaxAge: 30 * time.Second}
	if err := bus.EnsureStreams(ctx, js, env.Apply(bus.StreamConfig{})); err != nil {
		t.Fatal(err)
	}
	check("updated", 30*time.Second, -1, 0, -1)
}

// TestRetentionDefaults: the defaults of ALLOT_REQUESTS_MAX_AGE and the
// others are what a new stream gets when nothing is configured.
func TestRetentionDefaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := natstest.New(t).Connect(t)
	if err := bus.EnsureStreams(ctx, js, bus.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	r := streamConfig(t, js, wire.RequestStream)
	if r.MaxAge != bus.DefaultRequestsMaxAge || r.MaxBytes != bus.DefaultRequestsMaxBytes {
		t.Errorf("new %s: max_age %s max_bytes %d, want the defaults %s, %d", wire.RequestStream, r.MaxAge, r.MaxBytes, bus.DefaultRequestsMaxAge, int64(bus.DefaultRequestsMaxBytes))
	}
	e := streamConfig(t, js, wire.EventStream)
	if e.MaxAge != bus.DefaultEventsMaxAge || e.MaxBytes != bus.DefaultEventsMaxBytes {
		t.Errorf("new %s: max_age %s max_bytes %d, want the defaults", wire.EventStream, e.MaxAge, e.MaxBytes)
	}
}

// TestRetentionEnvValidate: limits below what makes sense are refused in
// one sentence naming the variable.
func TestRetentionEnvValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  bus.RetentionEnv
		ok   bool
	}{
		{"zero is no limit", bus.RetentionEnv{}, true},
		{"defaults", bus.RetentionEnv{RequestsMaxAge: 168 * time.Hour, RequestsMaxBytes: 8 << 30, EventsMaxAge: time.Hour, EventsMaxBytes: 1 << 20}, true},
		{"negative age", bus.RetentionEnv{RequestsMaxAge: -time.Second}, false},
		{"sub-second age", bus.RetentionEnv{EventsMaxAge: time.Millisecond}, false},
		{"tiny size", bus.RetentionEnv{RequestsMaxBytes: 1000}, false},
	} {
		if err := tc.env.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestReplicasNeverLowered: on a three-node cluster that has just formed,
// the streams and buckets are created with 3 replicas (waiting for the
// cluster with bus.Retry rather than failing), and a binary started without
// ALLOT_STREAM_REPLICAS (which passes its default, 1) or one that keeps
// what exists (0) never scales them down.
func TestReplicasNeverLowered(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := natstest.NewCluster(t, 3)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	nc, err := bus.Connect(c.URL(), t.Name(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ensure := func(replicas int) {
		t.Helper()
		err := bus.Retry(ctx, log, "ensure", 10*time.Second, func(ctx context.Context) error {
			_, err := bus.Setup(ctx, js, bus.StreamConfig{Replicas: replicas})
			return err
		})
		if err != nil {
			t.Fatalf("ensure with replicas %d: %v", replicas, err)
		}
	}
	want := func(when string) {
		t.Helper()
		for _, name := range []string{wire.RequestStream, wire.EventStream, wire.HoldStream, bus.DLQStream,
			bus.KeyValueStream(wire.ViewBucket), bus.KeyValueStream(bus.IdempotencyBucket), bus.KeyValueStream(bus.MembersBucket), bus.KeyValueStream(bus.ShardsBucket)} {
			if got := streamConfig(t, js, name).Replicas; got != 3 {
				t.Errorf("%s: %s has %d replicas, want 3", when, name, got)
			}
		}
	}
	ensure(3)
	want("created with ALLOT_STREAM_REPLICAS=3")
	ensure(1)
	want("ensured by a binary without ALLOT_STREAM_REPLICAS (default 1)")
	ensure(0)
	want("ensured by a binary that keeps what exists")
	if got, err := bus.KeepReplicas(ctx, js, wire.RequestStream, 1); err != nil || got != 3 {
		t.Errorf("KeepReplicas(%s, 1) = %d, %v; want 3", wire.RequestStream, got, err)
	}
}
