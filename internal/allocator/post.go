package allocator

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator/postcommit"
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
	a.m.rejected.Add(float64(out.refused))
	a.m.batchSize.Observe(float64(len(out.results)))
	// Views now, in this goroutine: they read activities the next batch
	// will change, and they must reach ingest before these results.
	a.publishViews(ctx, out.changed)
	if out.events > 0 {
		a.relay.Due() // woken when the apply loop next waits (pull.Collect)
	}
	b := postcommit.Batch{Last: last, Results: out.results}
	if a.post != nil {
		a.post.Send(b)
	} else {
		a.newPost().Do(b) // not launched (a test driving handle itself)
	}
	return nil
}

// newPost is the allocator's post-commit queue.
func (a *Allocator) newPost() *postcommit.Queue {
	return postcommit.New(a.deps.NATS, a.deps.Log, a.deps.Test.BeforeConfirm)
}
