package bus_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/natstest"
)

// TestPublishAtomic: a batch is stored whole, in order, each message under
// its own Nats-Msg-Id, at the sequences the returned first implies; a batch
// holding an id already stored is refused whole (ErrAtomicRefused), and a
// stream without atomic publish says so (ErrAtomicUnsupported); neither
// stores anything.
func TestPublishAtomic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := natstest.New(t)
	nc, js := ns.Connect(t)
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "ATOMIC", Subjects: []string{"atomic.>"}, AllowAtomicPublish: true, Duplicates: time.Minute},
		{Name: "PLAIN", Subjects: []string{"plain.>"}},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	batch := func(prefix string, from, n int) ([]*nats.Msg, []string) {
		var msgs []*nats.Msg
		var ids []string
		for i := from; i < from+n; i++ {
			m := nats.NewMsg(prefix + ".x")
			m.Data = []byte(strconv.Itoa(i))
			msgs, ids = append(msgs, m), append(ids, prefix+"-"+strconv.Itoa(i))
		}
		return msgs, ids
	}
	msgs, ids := batch("atomic", 0, 50)
	first, err := bus.PublishAtomic(nc, "ATOMIC", msgs, ids, 5*time.Second)
	if err != nil || first != 1 {
		t.Fatalf("first batch: first seq %d, err %v; want 1, nil", first, err)
	}
	st, err := js.Stream(ctx, "ATOMIC")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		m, err := st.GetMsg(ctx, first+uint64(i))
		if err != nil || string(m.Data) != strconv.Itoa(i) || m.Header.Get(jetstream.MsgIDHeader) != ids[i] {
			t.Fatalf("seq %d: %v, %v", first+uint64(i), m, err)
		}
	}
	// The second batch repeats the first one's last message.
	msgs, ids = batch("atomic", 49, 10)
	if _, err := bus.PublishAtomic(nc, "ATOMIC", msgs, ids, 5*time.Second); !errors.Is(err, bus.ErrAtomicRefused) {
		t.Fatalf("a batch with a stored id: %v, want ErrAtomicRefused", err)
	}
	msgs, ids = batch("plain", 0, 10)
	if _, err := bus.PublishAtomic(nc, "PLAIN", msgs, ids, 5*time.Second); !errors.Is(err, bus.ErrAtomicUnsupported) {
		t.Fatalf("a stream without atomic publish: %v, want ErrAtomicUnsupported", err)
	}
	for name, want := range map[string]uint64{"ATOMIC": 50, "PLAIN": 0} {
		if n := natstest.StreamMsgs(t, js, name); n != want {
			t.Errorf("%s holds %d messages, want %d", name, n, want)
		}
	}
}
