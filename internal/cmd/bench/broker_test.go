package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestCountStored: the requests a range of the request stream carries
// are counted from its messages' headers: a batch as its Allot-Batch, a
// single request or a malformed message as one; the printout divides
// them by the messages the stream's state stored, and names that figure
// as the one that shows why a burst got faster.
func TestCountStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := natstest.New(t)
	_, js := ns.Connect(t)
	if err := bus.EnsureStreams(ctx, js, config.Defaults[bus.Config]()); err != nil {
		t.Fatal(err)
	}
	subject := wire.RequestSubject(1)
	publish := func(header string, n int) uint64 {
		t.Helper()
		msg := nats.NewMsg(subject)
		msg.Header.Set(nats.MsgIdHdr, uuid.NewString())
		if header != "" {
			msg.Header.Set(wire.BatchHeader, header)
		}
		bodies := make([][]byte, n)
		for i := range bodies {
			b, err := json.Marshal(wire.Request{RequestID: uuid.NewString(), Op: wire.OpClaim, ActivityID: 1, UserID: int64(i + 1)})
			if err != nil {
				t.Fatal(err)
			}
			bodies[i] = b
		}
		msg.Data = bodies[0]
		if header != "" {
			msg.Data = wire.EncodeBatch(bodies)
		}
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	before := publish("", 1) // before the range
	publish("", 1)
	publish("3", 3)
	publish("", 1)
	publish("x", 2) // malformed: one refused message
	last := publish("5", 5)
	publish("7", 7) // after the range
	got, err := countStored(ctx, ns.URL(), before, last)
	if err != nil {
		t.Fatal(err)
	}
	if want := (storedRequests{messages: 5, requests: 1 + 3 + 1 + 1 + 5, batches: 2, batched: 8}); got != want {
		t.Fatalf("counted %+v, want %+v", got, want)
	}
	if n, err := countStored(ctx, ns.URL(), last, last); err != nil || n != (storedRequests{}) {
		t.Fatalf("an empty range: %+v, %v", n, err)
	}

	var b strings.Builder
	at := func(seq uint64) brokerSample {
		return brokerSample{streams: map[string]jetstream.StreamState{wire.RequestStream: {LastSeq: seq, Msgs: seq}}, batches: -1, batched: -1, msgs: -1, reqs: -1}
	}
	printBroker(&b, at(before), at(last), &got, 11)
	out := b.String()
	for _, line := range []string{
		"11 HTTP writes (the claims and the open): 11 requests stored in 5 messages of " + wire.RequestStream + ": 2.20 requests per message",
		"request batches: 2 messages carrying 8 requests (4.0 a batch); 3 messages of one request",
		"the figure that shows why a burst gets faster: requests per message (2.20 here)",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("the printout lacks %q:\n%s", line, out)
		}
	}
	if strings.Contains(out, "group commit") {
		t.Errorf("group commits printed without ingest's metrics:\n%s", out)
	}
	// With ingest's metrics: its atomic batches count messages, each one
	// request or a request batch.
	b.Reset()
	from, to := at(before), at(last)
	from.batches, from.batched = 10, 400
	to.batches, to.batched = 12, 404
	printBroker(&b, from, to, &got, 11)
	if line := "ingest's group commit (allot_ingest_commit_batch_size): 2 atomic batches carrying 4 messages (2.0 a batch); 1 messages published alone"; !strings.Contains(b.String(), line) {
		t.Errorf("the printout lacks %q:\n%s", line, b.String())
	}
	// And when ingest counts the requests in the messages it published.
	b.Reset()
	from.msgs, from.reqs = 100, 900
	to.msgs, to.reqs = 105, 911
	printBroker(&b, from, to, &got, 11)
	if line := "ingest's group commit: 11 requests in 5 messages (2.2 a message); 2 atomic batches carrying 4 of the messages (2.0 a batch)"; !strings.Contains(b.String(), line) {
		t.Errorf("the printout lacks %q:\n%s", line, b.String())
	}

	// After a run (the open loop's line): the stream's state now, and the
	// requests stored since before, up to its last message.
	after, stored, err := brokerAfter(ctx, "test", &server{natsURL: ns.URL()}, "http://127.0.0.1:1", at(before))
	if err != nil || stored == nil {
		t.Fatalf("brokerAfter: %v, %v", stored, err)
	}
	if want := (storedRequests{messages: 6, requests: 18, batches: 3, batched: 15}); *stored != want {
		t.Fatalf("counted %+v after the run, want %+v", *stored, want)
	}
	if line, want := storedLine(at(before), after, stored), "6 messages stored in "+wire.RequestStream+" carrying 18 requests: 3.00 requests per message"; line != want {
		t.Errorf("storedLine: %q, want %q", line, want)
	}
}
