package main

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/syncbuf"
	"github.com/allot-dev/allot/internal/wire"
)

// allotctl runs the command in process with args and returns its exit
// code, stdout and stderr.
func allotctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	// The connection's handlers may log after run returns.
	var stdout, stderr syncbuf.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// everything is what setup creates: every stream, and the stream behind
// every bucket.
var everything = []string{
	wire.HoldStream, wire.RequestStream, wire.EventStream, bus.DLQStream,
	bus.KeyValueStream(bus.IdempotencyBucket), bus.KeyValueStream(wire.ViewBucket), bus.KeyValueStream(bus.MembersBucket),
	bus.KeyValueStream(bus.ShardsBucket),
}

// TestUsage: no command or an unknown one prints the usage and exits 2;
// help exits 0.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"shard"}, {"setupp"}} {
		code, _, stderr := allotctl(t, args...)
		if code != 2 || !strings.Contains(stderr, "usage: allotctl <command>") || !strings.Contains(stderr, "setup") {
			t.Errorf("allotctl %v: exit %d, stderr %q; want 2 and the usage", args, code, stderr)
		}
	}
	if code, stdout, _ := allotctl(t, "help"); code != 0 || !strings.Contains(stdout, "setup") {
		t.Errorf("allotctl help: exit %d, %q", code, stdout)
	}
	if code, _, stderr := allotctl(t, "setup", "extra"); code != 2 || !strings.Contains(stderr, "unexpected argument") {
		t.Errorf("allotctl setup extra: exit %d, %q; want 2", code, stderr)
	}
}

// TestSetup: setup creates every stream and bucket (printing its effective
// configuration, the URL's password masked); run again it changes nothing;
// with another ALLOT_PARTITIONS it refuses (exit 2) and changes nothing.
func TestSetup(t *testing.T) {
	ns := natstest.New(t)
	_, js := ns.Connect(t)
	ctx := context.Background()
	url := strings.Replace(ns.URL(), "nats://", "nats://admin:s3cret@", 1)
	t.Setenv("ALLOT_NATS_URL", url)
	t.Setenv("ALLOT_PARTITIONS", "4")
	t.Setenv("ALLOT_REQUESTS_MAX_AGE", "48h")

	code, stdout, stderr := allotctl(t, "setup")
	if code != 0 {
		t.Fatalf("setup: exit %d\n%s", code, stderr)
	}
	if strings.Contains(stderr, "s3cret") || !strings.Contains(stderr, "ALLOT_NATS_URL=nats://admin:*****@") || !strings.Contains(stderr, "ALLOT_PARTITIONS=4") {
		t.Errorf("setup: the effective configuration is not printed masked:\n%s", stderr)
	}
	configs := map[string]jetstream.StreamInfo{}
	for _, name := range everything {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("after setup: %s: %v", name, err)
		}
		configs[name] = *st.CachedInfo()
		if !strings.Contains(stdout, name+" ") || !regexpLine(stdout, name, "created") {
			t.Errorf("setup's output does not say %s was created:\n%s", name, stdout)
		}
	}
	req := configs[wire.RequestStream].Config
	if bus.PartitionsOf(req) != 4 || req.MaxAge.Hours() != 48 || req.Discard != jetstream.DiscardNew {
		t.Errorf("%s: %d partitions, max_age %s, discard %s; want 4, 48h, new", wire.RequestStream, bus.PartitionsOf(req), req.MaxAge, req.Discard)
	}
	// What the binaries check at start passes.
	if _, n, err := bus.CheckRequestStream(ctx, js, 4); err != nil || n != 4 {
		t.Errorf("CheckRequestStream after setup: %d, %v", n, err)
	}
	for _, check := range []func(context.Context, jetstream.JetStream) error{bus.CheckHoldStream, bus.CheckEventStream, bus.CheckDLQStream} {
		if err := check(ctx, js); err != nil {
			t.Errorf("after setup: %v", err)
		}
	}
	for _, kc := range []jetstream.KeyValueConfig{bus.IdempotencyBucketConfig(1), bus.ViewBucketConfig(1), bus.MembersBucketConfig(1, bus.MembersTTL)} {
		if _, err := bus.CheckBucket(ctx, js, kc); err != nil {
			t.Errorf("after setup: %v", err)
		}
	}

	// Again: nothing changes.
	code, stdout, stderr = allotctl(t, "setup")
	if code != 0 {
		t.Fatalf("second setup: exit %d\n%s", code, stderr)
	}
	for _, name := range everything {
		if !regexpLine(stdout, name, "unchanged") {
			t.Errorf("second setup: %s not unchanged:\n%s", name, stdout)
		}
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo(); !reflect.DeepEqual(got.Config, configs[name].Config) || !got.Created.Equal(configs[name].Created) {
			t.Errorf("second setup changed %s: %+v, was %+v", name, got.Config, configs[name].Config)
		}
	}

	// Another number of partitions is refused, and changes nothing.
	t.Setenv("ALLOT_PARTITIONS", "2")
	code, _, stderr = allotctl(t, "setup")
	if code != 2 || !strings.Contains(stderr, "another number of partitions") || !strings.Contains(stderr, "has 4, ALLOT_PARTITIONS is 2") {
		t.Errorf("setup with 2 partitions over 4: exit %d, %q; want 2 and the refusal", code, lastLine(stderr))
	}
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st.CachedInfo().Config, req) {
		t.Errorf("the refused setup changed %s", wire.RequestStream)
	}
}

// TestSetupRepairs: a stream changed behind allot's back (discard old, the
// change that lets a full stream drop unapplied requests) fails the
// binaries' check, and setup puts it back.
func TestSetupRepairs(t *testing.T) {
	ns := natstest.New(t)
	_, js := ns.Connect(t)
	ctx := context.Background()
	t.Setenv("ALLOT_NATS_URL", ns.URL())
	if code, _, stderr := allotctl(t, "setup"); code != 0 {
		t.Fatalf("setup: exit %d\n%s", code, stderr)
	}
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Discard = jetstream.DiscardOld
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	_, _, err = bus.CheckRequestStream(ctx, js, 1)
	if err == nil || !bus.IsSetupError(err) || !strings.Contains(err.Error(), "Discard") {
		t.Fatalf("check of a stream with discard old: %v; want a setup error naming Discard", err)
	}
	t.Logf("the check says: %v", err)
	code, stdout, stderr := allotctl(t, "setup")
	if code != 0 || !regexpLine(stdout, wire.RequestStream, "updated") {
		t.Fatalf("setup over the changed stream: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if _, _, err := bus.CheckRequestStream(ctx, js, 1); err != nil {
		t.Errorf("after setup again: %v", err)
	}
}

// regexpLine reports whether out has a line starting with name whose
// second field is action.
func regexpLine(out, name, action string) bool {
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == name && f[1] == action {
			return true
		}
	}
	return false
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
