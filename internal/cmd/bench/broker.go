package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// brokerSample is what the broker of the stack under test stores: each
// stream's state, and ingest's group commits so far (from its metrics).
type brokerSample struct {
	streams map[string]jetstream.StreamState
	// batches and batched are the atomic batches ingest published and the
	// messages they carried (allot_ingest_commit_batch_size's count and
	// sum), msgs and reqs the messages its group commit published and the
	// requests in them (allot_ingest_message_requests'); -1 when the
	// metrics could not be read.
	batches, batched, msgs, reqs float64
}

// sampleBroker reads every stream of the JetStream server at natsURL and
// the commit-batch histogram of the ingest serving baseURL.
func sampleBroker(ctx context.Context, natsURL, baseURL string) (brokerSample, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b := brokerSample{streams: map[string]jetstream.StreamState{}, batches: -1, batched: -1, msgs: -1, reqs: -1}
	nc, err := bus.Connect(natsURL, "bench-broker", slog.New(slog.DiscardHandler))
	if err != nil {
		return b, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return b, err
	}
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		b.streams[info.Config.Name] = info.State
	}
	if err := l.Err(); err != nil {
		return b, err
	}
	b.batches, b.batched, b.msgs, b.reqs = commitBatches(ctx, baseURL)
	return b, nil
}

// storedRequests is what a range of ALLOT_REQUESTS carries: its messages
// and the requests in them, read from each message's headers (a batch's
// wire.BatchHeader; any other message is one request).
type storedRequests struct {
	messages int
	requests int
	// batches are the messages that are request batches, batched the
	// requests they carry.
	batches, batched int
}

// countStored reads the headers (not the bodies) of the messages of
// ALLOT_REQUESTS after sequence after up to last, at natsURL.
func countStored(ctx context.Context, natsURL string, after, last uint64) (storedRequests, error) {
	var n storedRequests
	if last <= after {
		return n, nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	nc, err := bus.Connect(natsURL, "bench-broker", slog.New(slog.DiscardHandler))
	if err != nil {
		return n, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return n, err
	}
	cons, err := js.OrderedConsumer(ctx, wire.RequestStream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: after + 1, HeadersOnly: true,
	})
	if err != nil {
		return n, err
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(4096))
	if err != nil {
		return n, err
	}
	defer iter.Stop()
	context.AfterFunc(ctx, iter.Stop)
	for {
		msg, err := iter.Next()
		if err != nil {
			return n, fmt.Errorf("read %s after seq %d: %w", wire.RequestStream, after, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return n, err
		}
		if md.Sequence.Stream > last {
			return n, nil
		}
		n.messages++
		size, err := wire.BatchSize(msg.Headers().Get(wire.BatchHeader))
		switch {
		case err != nil:
			n.requests++ // malformed: refused as one
		case size > 0:
			n.requests += size
			n.batches++
			n.batched += size
		default:
			n.requests++
		}
		if md.Sequence.Stream == last || md.NumPending == 0 {
			return n, nil
		}
	}
}

// commitBatches reads the count and sum of allot_ingest_commit_batch_size
// and of allot_ingest_message_requests from baseURL's /metrics; -1 each
// when it cannot.
func commitBatches(ctx context.Context, baseURL string) (count, sum, msgs, reqs float64) {
	count, sum, msgs, reqs = -1, -1, -1, -1
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/metrics", nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			continue
		}
		switch name {
		case "allot_ingest_commit_batch_size_count":
			count = f
		case "allot_ingest_commit_batch_size_sum":
			sum = f
		case "allot_ingest_message_requests_count":
			msgs = f
		case "allot_ingest_message_requests_sum":
			reqs = f
		}
	}
	return
}

// printBroker prints what the broker stored between before and after,
// for writes HTTP writes (the claims and the open); stored is what the
// request stream's new messages carry (nil when it could not be read).
func printBroker(w io.Writer, before, after brokerSample, stored *storedRequests, writes int) {
	names := make([]string, 0, len(after.streams))
	for n := range after.streams {
		names = append(names, n)
	}
	slices.Sort(names)
	fmt.Fprintf(w, "broker (JetStream) during the burst, stream by stream (messages before → after, stored):\n")
	for _, n := range names {
		a, b := after.streams[n], before.streams[n]
		if a.LastSeq == b.LastSeq {
			continue
		}
		fmt.Fprintf(w, "  %-20s %d → %d messages, last seq %d → %d: %d stored, %.1f MB\n", n, b.Msgs, a.Msgs,
			b.LastSeq, a.LastSeq, a.LastSeq-b.LastSeq, float64(int64(a.Bytes)-int64(b.Bytes))/1e6)
	}
	msgs := storedMessages(before, after)
	requests := float64(writes) // when the headers were not read
	if stored != nil {
		requests = float64(stored.requests)
	}
	if msgs > 0 {
		fmt.Fprintf(w, "  %d HTTP writes (the claims and the open): %.0f requests stored in %d messages of %s: %.2f requests per message\n",
			writes, requests, msgs, wire.RequestStream, requests/float64(msgs))
		if stored != nil {
			fmt.Fprintf(w, "  request batches: %d messages carrying %d requests (%.1f a batch); %d messages of one request\n",
				stored.batches, stored.batched, perBatch(float64(stored.batched), float64(stored.batches)), stored.messages-stored.batches)
		}
	}
	switch {
	case before.batches >= 0 && after.batches >= 0 && before.msgs >= 0 && after.msgs >= 0:
		// Ingest counts the messages its group commit published and the
		// requests in them (allot_ingest_message_requests).
		n, in := after.batches-before.batches, after.batched-before.batched
		pubMsgs, pubReqs := after.msgs-before.msgs, after.reqs-before.reqs
		fmt.Fprintf(w, "  ingest's group commit: %.0f requests in %.0f messages (%.1f a message); %.0f atomic batches carrying %.0f of the messages (%.1f a batch)\n",
			pubReqs, pubMsgs, perBatch(pubReqs, pubMsgs), n, in, perBatch(in, n))
	case before.batches >= 0 && after.batches >= 0:
		n, in := after.batches-before.batches, after.batched-before.batched
		fmt.Fprintf(w, "  ingest's group commit (allot_ingest_commit_batch_size): %.0f atomic batches carrying %.0f messages (%.1f a batch); %.0f messages published alone\n",
			n, in, perBatch(in, n), max(float64(msgs)-in, 0))
	}
	if msgs > 0 {
		fmt.Fprintf(w, "  the figure that shows why a burst gets faster: requests per message (%.2f here). The broker's cost is per "+
			"message stored (a store write and a PubAck each), so the same requests in fewer messages is the saving\n", requests/float64(msgs))
	}
}

// perBatch is n items over batches, 0 without batches.
func perBatch(n, batches float64) float64 {
	if batches <= 0 {
		return 0
	}
	return n / batches
}

// storedMessages is how many messages the request stream stored between
// before and after, from its state; the requests in them come from their
// headers (countStored).
func storedMessages(before, after brokerSample) uint64 {
	return after.streams[wire.RequestStream].LastSeq - before.streams[wire.RequestStream].LastSeq
}

// storedLine is printBroker's figure in one line: the request stream's
// messages stored between before and after, and the requests in each.
func storedLine(before, after brokerSample, stored *storedRequests) string {
	msgs := storedMessages(before, after)
	if stored == nil {
		return fmt.Sprintf("%d messages stored in %s (the requests in them not counted)", msgs, wire.RequestStream)
	}
	return fmt.Sprintf("%d messages stored in %s carrying %d requests: %.2f requests per message",
		msgs, wire.RequestStream, stored.requests, perBatch(float64(stored.requests), float64(msgs)))
}

// brokerAfter samples the broker of the stack s (serving url) after a run
// that began at before, and counts the requests stored in between: nil
// when they could not be counted (said on stderr, under name).
func brokerAfter(ctx context.Context, name string, s *server, url string, before brokerSample) (brokerSample, *storedRequests, error) {
	after, err := sampleBroker(ctx, s.natsURL, url)
	if err != nil {
		return after, nil, err
	}
	n, err := countStored(ctx, s.natsURL, before.streams[wire.RequestStream].LastSeq, after.streams[wire.RequestStream].LastSeq)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s: the requests stored not counted: %v\n", name, err)
		return after, nil, nil
	}
	return after, &n, nil
}
