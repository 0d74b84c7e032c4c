package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestChecksWaitOrStop: the start-time checks tell the two cases apart. A
// server without JetStream (a cluster still electing its meta leader
// answers no better) is ErrUnavailable, which the binaries wait out; a
// JetStream that answers without the streams, or with one changed, is
// ErrNotSetUp, which stops them, and the line names the stream.
func TestChecksWaitOrStop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	late := natstest.NewLate(t)
	pjs, err := jetstream.New(late.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(ctx, 2*time.Second)
	_, _, err = bus.CheckRequestStream(actx, pjs, 0)
	acancel()
	if !errors.Is(err, bus.ErrUnavailable) || bus.IsSetupError(err) {
		t.Errorf("check without JetStream: %v; want ErrUnavailable (wait), not a setup error", err)
	}

	ns := natstest.New(t)
	_, js := ns.Connect(t)
	_, _, err = bus.CheckRequestStream(ctx, js, 0)
	if !bus.IsSetupError(err) || errors.Is(err, bus.ErrUnavailable) || err.Error() != "stream ALLOT_REQUESTS does not exist: run `allotctl setup`" {
		t.Errorf("check without the stream: %v; want the not-set-up line", err)
	}
	if _, err := bus.CheckBucket(ctx, js, bus.ViewBucketConfig(1)); err == nil || err.Error() != "bucket ALLOT_VIEW does not exist: run `allotctl setup`" {
		t.Errorf("check without the bucket: %v", err)
	}

	ns.Setup(t, natstest.Config(3))
	if _, n, err := bus.CheckRequestStream(ctx, js, 0); err != nil || n != 3 {
		t.Errorf("check after setup: %d partitions, %v", n, err)
	}
	if _, _, err := bus.CheckRequestStream(ctx, js, 2); !errors.Is(err, bus.ErrPartitionsChanged) {
		t.Errorf("check with 2 partitions of 3: %v; want ErrPartitionsChanged", err)
	}

	// Each change an operator (or an attacker with the rights) could make
	// behind allot's back is caught, and a new setup repairs it.
	for _, tc := range []struct {
		stream string
		change func(*jetstream.StreamConfig)
		check  func() error
		want   string
	}{
		{wire.RequestStream, func(c *jetstream.StreamConfig) { c.Discard = jetstream.DiscardOld }, func() error {
			_, _, err := bus.CheckRequestStream(ctx, js, 3)
			return err
		}, "Discard"},
		{wire.RequestStream, func(c *jetstream.StreamConfig) { c.Sources = nil }, func() error {
			_, _, err := bus.CheckRequestStream(ctx, js, 3)
			return err
		}, "Sources"},
		{wire.HoldStream, func(c *jetstream.StreamConfig) { c.Subjects = []string{"elsewhere.>"} }, func() error { return bus.CheckHoldStream(ctx, js) }, "Subjects"},
		{wire.EventStream, func(c *jetstream.StreamConfig) { c.AllowAtomicPublish = false }, func() error { return bus.CheckEventStream(ctx, js) }, "AllowAtomicPublish"},
		{bus.DLQStream, func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy }, func() error { return bus.CheckDLQStream(ctx, js) }, "Retention"},
		{bus.KeyValueStream(bus.IdempotencyBucket), func(c *jetstream.StreamConfig) { c.MaxAge = 48 * time.Hour }, func() error {
			_, err := bus.CheckBucket(ctx, js, bus.IdempotencyBucketConfig(1))
			return err
		}, "ttl"},
	} {
		st, err := js.Stream(ctx, tc.stream)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		tc.change(&cfg)
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("change %s: %v", tc.stream, err)
		}
		if err := tc.check(); !bus.IsSetupError(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s changed (%s): check says %v", tc.stream, tc.want, err)
		}
		ns.Setup(t, natstest.Config(3))
		if err := tc.check(); err != nil {
			t.Errorf("%s after setup again: %v", tc.stream, err)
		}
	}
}

// TestOperatorsDuplicateWindowIsKept: the request stream's duplicate window
// is the operator's to choose (ingest settles a lost PubAck within whatever
// it is): the start-time check accepts another one, and setup run again
// keeps it instead of putting the default back.
func TestOperatorsDuplicateWindowIsKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := natstest.New(t)
	_, js := ns.Connect(t)
	ns.Setup(t, config.Defaults[bus.Config]())
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Duplicates != bus.DefaultRequestDuplicates {
		t.Fatalf("a new request stream's duplicate window is %s, want %s", cfg.Duplicates, bus.DefaultRequestDuplicates)
	}
	cfg.Duplicates = 7 * time.Second
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, _, err := bus.CheckRequestStream(ctx, js, 0); err != nil {
		t.Errorf("check with an operator's duplicate window: %v", err)
	}
	ns.Setup(t, config.Defaults[bus.Config]())
	if st, err = js.Stream(ctx, wire.RequestStream); err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.Duplicates; got != 7*time.Second {
		t.Errorf("after setup again the duplicate window is %s, want the operator's 7s", got)
	}
}
