package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
// for writes HTTP writes (the claims and the open).
func printBroker(w io.Writer, before, after brokerSample, writes int) {
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
	stored := after.streams[wire.RequestStream].LastSeq - before.streams[wire.RequestStream].LastSeq
	if stored > 0 {
		fmt.Fprintf(w, "  %d HTTP writes (the claims and the open) stored as %d messages in %s: %.2f requests per message\n",
			writes, stored, wire.RequestStream, float64(writes)/float64(stored))
	}
	if before.batches >= 0 && after.batches >= 0 && before.msgs >= 0 && after.msgs >= 0 {
		n, in := after.batches-before.batches, after.batched-before.batched
		msgs, reqs := after.msgs-before.msgs, after.reqs-before.reqs
		mean, per := 0.0, 0.0
		if n > 0 {
			mean = in / n
		}
		if msgs > 0 {
			per = reqs / msgs
		}
		fmt.Fprintf(w, "  ingest's group commit: %.0f requests in %.0f messages (%.1f a message); %.0f atomic batches carrying %.0f of the messages (%.1f a batch)\n",
			reqs, msgs, per, n, in, mean)
	}
}
