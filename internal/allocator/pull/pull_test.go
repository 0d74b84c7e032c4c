package pull

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/natstest"
)

// TestCollectTakesWhatIsBuffered: a batch takes every message already in
// the consumer's buffer, up to its size, whether it waits for more (wait)
// or not (eager), and an eager batch returns without waiting for later
// messages. onIdle runs only for a pull that finds nothing buffered.
func TestCollectTakesWhatIsBuffered(t *testing.T) {
	js, f := feedOn(t, 30)
	ctx := context.Background()
	defer f.Stop()
	// The first message in hand means the pull's delivery has begun; the
	// rest follow it into the buffer.
	first, err := Collect(f, 10*time.Second, 0, 1, true, nil)
	if err != nil || len(first) != 1 {
		t.Fatalf("first message: %d, %v", len(first), err)
	}
	for deadline := time.Now().Add(30 * time.Second); len(f.items) < 29; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the other 29 messages read ahead", len(f.items))
		}
	}
	idled := 0
	wasIdle := make(chan struct{}, 1)
	onIdle := func() {
		idled++
		select {
		case wasIdle <- struct{}{}:
		default:
		}
	}
	got, err := Collect(f, time.Second, 0, 10, true, onIdle)
	if err != nil || len(got) != 10 {
		t.Fatalf("eager, size 10, 29 buffered: took %d (%v), want 10", len(got), err)
	}
	got, err = Collect(f, time.Second, 0, 100, false, onIdle)
	if err != nil || len(got) != 19 {
		t.Fatalf("wait 0, 19 buffered: took %d (%v), want all 19", len(got), err)
	}
	if idled != 0 {
		t.Fatalf("onIdle ran %d times while messages were buffered", idled)
	}
	// Nothing buffered: onIdle runs, and the batch is the one message that
	// comes within the idle wait; a waiting one takes a message that comes
	// within its wait.
	go func() {
		<-wasIdle
		js.Publish(ctx, "s.late", []byte("m")) //nolint:errcheck // checked below
	}()
	got, err = Collect(f, 30*time.Second, 0, 100, true, onIdle)
	if err != nil || len(got) != 1 || got[0].Subject() != "s.late" {
		t.Fatalf("eager with nothing buffered: %d messages (%v), want the one that came", len(got), err)
	}
	if idled != 1 {
		t.Fatalf("onIdle ran %d times for a pull that found nothing buffered, want once", idled)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		js.Publish(ctx, "s.later", []byte("m")) //nolint:errcheck // checked below
	}()
	got, err = Collect(f, 30*time.Second, 30*time.Second, 1, false, nil)
	if err != nil || len(got) != 1 || got[0].Subject() != "s.later" {
		t.Fatalf("the next message: %d (%v)", len(got), err)
	}
}

// TestAStoppedFeedSaysSo: Collect on a stopped feed returns at once with
// the iterator's closed error, whether it was waiting or not, and the
// iterator is stopped (TestMain checks that the feed's goroutine ends).
func TestAStoppedFeedSaysSo(t *testing.T) {
	_, f := feedOn(t, 0)
	go func() {
		time.Sleep(100 * time.Millisecond)
		f.Stop()
	}()
	got, err := Collect(f, time.Minute, 0, 10, false, nil) // nil, nil after the minute
	if len(got) != 0 || !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
		t.Fatalf("stopped while waiting: %d messages, %v", len(got), err)
	}
	f.Stop()
	if _, err := Collect(f, time.Minute, 0, 10, false, nil); !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
		t.Fatalf("stopped before: %v", err)
	}
	// The consumer's iterator is stopped too, not left pulling (a Next
	// still running in the feed's reader holds the iterator's lock).
	closed := make(chan error, 1)
	go func() {
		_, err := f.iter.Next(jetstream.NextMaxWait(time.Second))
		closed <- err
	}()
	select {
	case err := <-closed:
		if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			t.Fatalf("the iterator after Stop: %v, want it closed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the iterator after Stop: still read by the feed")
	}
}

// feedOn is a feed on a fresh stream holding n messages (subjects s.0,
// s.1, ...), its consumer acknowledging nothing; the test stops it.
func feedOn(t *testing.T, n int) (jetstream.JetStream, *Feed) {
	t.Helper()
	ns := natstest.New(t)
	_, js := ns.Connect(t)
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, "s."+strconv.Itoa(i), []byte("m")); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(100))
	if err != nil {
		t.Fatal(err)
	}
	return js, newFeed(iter, 100)
}
