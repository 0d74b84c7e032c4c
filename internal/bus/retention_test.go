package bus_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
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
// stream dropping its oldest), a setup run again with the same settings
// keeps them, and a changed setting updates the existing streams.
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
	c := config.Defaults[bus.Config]()
	c.RequestsMaxAge, c.RequestsMaxBytes, c.EventsMaxAge, c.EventsMaxBytes = 48*time.Hour, 64<<20, 24*time.Hour, 32<<20
	if err := bus.EnsureStreams(ctx, js, c); err != nil {
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

	// The same settings again change nothing.
	if err := bus.EnsureStreams(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	check("ensured again", 48*time.Hour, 64<<20, 24*time.Hour, 32<<20)

	// 0 means no limit; a short age shrinks the duplicate window with it.
	c.RequestsMaxAge, c.RequestsMaxBytes, c.EventsMaxAge, c.EventsMaxBytes = 30*time.Second, 0, 0, 0
	if err := bus.EnsureStreams(ctx, js, c); err != nil {
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
	if err := bus.EnsureStreams(ctx, js, config.Defaults[bus.Config]()); err != nil {
		t.Fatal(err)
	}
	// The defaults as the operations page states them: a week of both,
	// no size bound on the requests, 1 GiB of events.
	const week = 7 * 24 * time.Hour
	r := streamConfig(t, js, wire.RequestStream)
	if r.MaxAge != week || r.MaxBytes != -1 {
		t.Errorf("new %s: max_age %s max_bytes %d, want the defaults %s, -1", wire.RequestStream, r.MaxAge, r.MaxBytes, week)
	}
	e := streamConfig(t, js, wire.EventStream)
	if e.MaxAge != week || e.MaxBytes != 1<<30 {
		t.Errorf("new %s: max_age %s max_bytes %d, want the defaults %s, %d", wire.EventStream, e.MaxAge, e.MaxBytes, week, 1<<30)
	}
}

// TestConfigValidate: limits below what makes sense are refused in one
// sentence naming the variable.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		set  func(*bus.Config)
		ok   bool
	}{
		{"defaults", func(*bus.Config) {}, true},
		{"zero is no limit", func(c *bus.Config) {
			c.RequestsMaxAge, c.RequestsMaxBytes, c.EventsMaxAge, c.EventsMaxBytes = 0, 0, 0, 0
		}, true},
		{"limits", func(c *bus.Config) { c.RequestsMaxBytes, c.EventsMaxAge, c.EventsMaxBytes = 8<<30, time.Hour, 1<<20 }, true},
		{"negative age", func(c *bus.Config) { c.RequestsMaxAge = -time.Second }, false},
		{"sub-second age", func(c *bus.Config) { c.EventsMaxAge = time.Millisecond }, false},
		{"tiny size", func(c *bus.Config) { c.RequestsMaxBytes = 1000 }, false},
		{"no partition", func(c *bus.Config) { c.Partitions = 0 }, false},
		{"no replica", func(c *bus.Config) { c.Replicas = 0 }, false},
	} {
		c := config.Defaults[bus.Config]()
		tc.set(&c)
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestReplicasNeverLowered: on a three-node cluster that has just formed,
// the streams and buckets are created with 3 replicas (waiting for the
// cluster with bus.Retry rather than failing), and a setup run without
// ALLOT_STREAM_REPLICAS (its default, 1) never scales them down.
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
			sc := config.Defaults[bus.Config]()
			sc.Replicas = replicas
			_, err := bus.Setup(ctx, js, sc, nil)
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
	want("ensured without ALLOT_STREAM_REPLICAS (default 1)")
	if got, err := bus.KeepReplicas(ctx, js, wire.RequestStream, 1); err != nil || got != 3 {
		t.Errorf("KeepReplicas(%s, 1) = %d, %v; want 3", wire.RequestStream, got, err)
	}
}
