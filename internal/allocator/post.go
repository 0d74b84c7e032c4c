package allocator

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/wire"
)

// afterCommit acknowledges what the commit covered, terminates rejected
// messages, wakes waiting clients and the outbox relay.
func (a *Allocator) afterCommit(ctx context.Context, items []item, out outcome) error {
	if a.deps.Test.AfterCommit != nil {
		if err := a.deps.Test.AfterCommit(); err != nil {
			return fmt.Errorf("%w: %w", ErrCrashed, err)
		}
	}
	var last jetstream.Msg
	for _, it := range items {
		if it.msg == nil || it.seq > out.fence {
			continue
		}
		if reason, bad := out.rejected[it.seq]; bad {
			a.m.rejected.Inc()
			a.deps.Log.WarnContext(ctx, "malformed request terminated", slog.Uint64("seq", it.seq),
				slog.String("subject", it.subject), slog.String("reason", reason))
			it.msg.TermWithReason(reason) //nolint:errcheck // the fence already covers it
			continue
		}
		if last != nil {
			last.Ack() //nolint:errcheck // a lost ack is a redelivery the fence skips
		}
		last = it.msg
	}
	a.m.batchSize.Observe(float64(len(out.results)))
	// Views now, in this goroutine: they read activities the next batch
	// will change, and they must reach ingest before these results.
	a.publishViews(ctx, out.changed)
	if out.events > 0 {
		a.relay.Kick()
	}
	if p := (postCommit{last: last, results: out.results}); a.post != nil {
		a.post <- p
	} else {
		a.postOne(p) // not launched (a test driving handle itself)
	}
	return nil
}

// postQueue is how many committed batches may wait for postLoop before the
// apply loop waits for it.
const postQueueLen = 4

// postCommit is what follows a commit off the apply loop's path.
type postCommit struct {
	// last is the batch's last acknowledged message, sent as a DoubleAck:
	// its confirmation says the server has taken every ack sent before it
	// on this connection.
	last    jetstream.Msg
	results []wire.Result
	// flushed, when set, is closed once everything before it is done.
	flushed chan struct{}
}

// flushPost waits until postLoop has done every batch queued so far.
func (a *Allocator) flushPost() {
	if a.post == nil {
		return
	}
	done := make(chan struct{})
	a.post <- postCommit{flushed: done}
	<-done
}

// postLoop confirms each batch's acks and tells waiting clients about its
// results, in commit order, while the apply loop goes on with the next
// batch. Neither is needed for exactly-once (an ack the server never got
// is a redelivery the fence skips; a lost result notice sends the client
// to MySQL), so neither holds up the next commit: waiting for the
// confirmation in the loop cost about a tenth of a hot activity's drain.
// It runs until ctx ends, which happens only once the apply loop has
// returned (launch), then does what is still queued and returns nil.
func (a *Allocator) postLoop(ctx context.Context) error {
	for {
		select {
		case p := <-a.post:
			a.postOne(p)
		case <-ctx.Done():
			for {
				select {
				case p := <-a.post:
					a.postOne(p)
				default:
					return nil
				}
			}
		}
	}
}

func (a *Allocator) postOne(p postCommit) {
	if p.last != nil {
		if a.deps.Test.BeforeConfirm != nil {
			a.deps.Test.BeforeConfirm()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.last.DoubleAck(ctx); err != nil {
			a.deps.Log.Warn("ack not confirmed; the fence will skip the redelivery", slog.Any("err", err))
		}
		cancel()
	}
	if len(p.results) > 0 {
		a.publishResults(p.results)
	}
	if p.flushed != nil {
		close(p.flushed)
	}
}

// publishResults tells waiting HTTP handlers about the results just
// committed. Core NATS, at most once: handlers fall back to MySQL.
func (a *Allocator) publishResults(results []wire.Result) {
	const chunk = 1000
	for lo := 0; lo < len(results); lo += chunk {
		part := results[lo:min(lo+chunk, len(results))]
		b, err := json.Marshal(wire.ResultBatch{Results: part})
		if err == nil && int64(len(b)) > a.deps.NATS.MaxPayload() && len(part) > 1 {
			// A huge result (a resize promoting many) would take the
			// others' notices down with it: one at a time, and one too big
			// for a message is read from MySQL by its waiter.
			for _, r := range part {
				a.publishResults([]wire.Result{r})
			}
			continue
		}
		if err == nil && int64(len(b)) <= a.deps.NATS.MaxPayload() {
			a.deps.NATS.Publish(wire.ResultSubject, b) //nolint:errcheck // best effort by design
		}
	}
}
