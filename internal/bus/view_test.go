package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestViewBucketExpiresClearedViews: the view bucket takes per-message
// TTLs, also when it existed before without them (an upgrade), so that a
// cleared view put with one leaves no key behind; its views are kept.
func TestViewBucketExpiresClearedViews(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	_, js := ns.Connect(t)
	ctx := context.Background()
	// The bucket as earlier versions made it, holding a view.
	old, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.ViewBucket, History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Put(ctx, wire.ViewKey(1), []byte(`{"activity_id":1,"seq":5}`)); err != nil {
		t.Fatal(err)
	}
	// Setup upgrades it in place.
	if _, err := bus.Setup(ctx, js, config.Defaults[bus.Config](), nil); err != nil {
		t.Fatal(err)
	}
	kv, err := bus.CheckBucket(ctx, js, bus.ViewBucketConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, wire.ViewKey(1)); err != nil {
		t.Fatalf("the view stored before the upgrade: %v", err)
	}
	msg := nats.NewMsg("$KV." + wire.ViewBucket + "." + wire.ViewKey(2))
	msg.Data = []byte(`{"activity_id":2,"seq":9}`)
	msg.Header.Set(jetstream.MsgTTLHeader, "1s")
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("a put with a TTL: %v", err)
	}
	st, err := js.Stream(ctx, bus.KeyValueStream(wire.ViewBucket))
	if err != nil {
		t.Fatal(err)
	}
	subject := "$KV." + wire.ViewBucket + "." + wire.ViewKey(2)
	for deadline := time.Now().Add(30 * time.Second); ; {
		// The put expires, then the marker the server leaves for it.
		if _, err := st.GetLastMsgForSubject(ctx, subject); errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cleared view never left the bucket")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := kv.Get(ctx, wire.ViewKey(1)); err != nil {
		t.Fatalf("a view without a TTL expired: %v", err)
	}
}
