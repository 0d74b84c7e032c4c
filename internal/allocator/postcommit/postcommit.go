// Package postcommit does what follows an allocator's commit but need not
// hold up its next batch: telling waiting clients about the batch's
// results and confirming its acks, in commit order.
package postcommit

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/wire"
)

// queueLen is how many committed batches may wait for Run before Send
// waits for it.
const queueLen = 4

// Batch is what follows one commit off the apply loop's path.
type Batch struct {
	// Last is the batch's last acknowledged message, sent as a DoubleAck:
	// its confirmation says the server has taken every ack sent before it
	// on this connection.
	Last    jetstream.Msg
	Results []wire.Result
	// flushed, when set, is closed once everything before it is done.
	flushed chan struct{}
}

// Queue carries the committed batches to Run, in commit order.
type Queue struct {
	ch  chan Batch
	nc  *nats.Conn
	log *slog.Logger
	// beforeConfirm runs before a batch's acks are confirmed (tests).
	beforeConfirm func()
}

// New returns a queue that notifies on nc; Run works it off.
func New(nc *nats.Conn, log *slog.Logger, beforeConfirm func()) *Queue {
	return &Queue{ch: make(chan Batch, queueLen), nc: nc, log: log, beforeConfirm: beforeConfirm}
}

// Send queues b; it waits while queueLen batches wait.
func (q *Queue) Send(b Batch) { q.ch <- b }

// Flush waits until Run has done every batch queued so far.
func (q *Queue) Flush() {
	done := make(chan struct{})
	q.ch <- Batch{flushed: done}
	<-done
}

// Run tells waiting clients about each batch's results and confirms its
// acks, in commit order, while the apply loop goes on with the next
// batch. Neither is needed for exactly-once (an ack the server never got
// is a redelivery the fence skips; a lost result notice sends the client
// to MySQL), so neither holds up the next commit: waiting for the
// confirmation in the loop cost about a tenth of a hot activity's drain.
// It runs until ctx ends, which the allocator makes happen only once its
// apply loop has returned, then does what is still queued and returns nil.
func (q *Queue) Run(ctx context.Context) error {
	for {
		select {
		case b := <-q.ch:
			q.Do(b)
		case <-ctx.Done():
			for {
				select {
				case b := <-q.ch:
					q.Do(b)
				default:
					return nil
				}
			}
		}
	}
}

// Do does b at once, in the caller's goroutine. The results go first:
// their waiters need not wait for a broker round trip that changes nothing
// for them.
func (q *Queue) Do(p Batch) {
	if len(p.Results) > 0 {
		q.publishResults(p.Results)
	}
	if p.Last != nil {
		if q.beforeConfirm != nil {
			q.beforeConfirm()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.Last.DoubleAck(ctx); err != nil {
			q.log.Warn("ack not confirmed; the fence will skip the redelivery", slog.Any("err", err))
		}
		cancel()
	}
	if p.flushed != nil {
		close(p.flushed)
	}
}

// publishResults tells waiting HTTP handlers about the results just
// committed. Core NATS, at most once: handlers fall back to MySQL.
func (q *Queue) publishResults(results []wire.Result) {
	const chunk = 1000
	for lo := 0; lo < len(results); lo += chunk {
		part := results[lo:min(lo+chunk, len(results))]
		b := wire.AppendResults(nil, part)
		if int64(len(b)) > q.nc.MaxPayload() && len(part) > 1 {
			// A huge result (a resize promoting many) would take the
			// others' notices down with it: one at a time, and one too big
			// for a message is read from MySQL by its waiter.
			for _, r := range part {
				q.publishResults([]wire.Result{r})
			}
			continue
		}
		if int64(len(b)) <= q.nc.MaxPayload() {
			q.nc.Publish(wire.ResultSubject, b) //nolint:errcheck // best effort by design
		}
	}
}
