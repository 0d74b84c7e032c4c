// Package pull is the allocator's apply loop's pull on its partition's
// consumer: the message iterator in use, and collecting the next batch
// from it.
package pull

import (
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Puller is the apply loop's pull on the consumer; its Stop may come from
// another goroutine (the loop's context ending).
type Puller struct {
	mu   sync.Mutex
	iter jetstream.MessagesContext
}

func (p *Puller) Current() jetstream.MessagesContext {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.iter
}

func (p *Puller) Set(it jetstream.MessagesContext) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.iter = it
}

// Forget drops it, closed, unless another pull replaced it.
func (p *Puller) Forget(it jetstream.MessagesContext) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.iter == it {
		p.iter = nil
	}
}

func (p *Puller) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.iter != nil {
		p.iter.Stop()
		p.iter = nil
	}
}

// drained is how long Collect waits for a message it takes to be in the
// consumer's buffer already: to tell an idle pull (onIdle) from a busy one,
// and for the rest of a batch once its wait is over.
const drained = 50 * time.Microsecond

// Collect returns the next batch of at most size messages: it waits up to
// idle for a first message, then up to wait more for the rest (not at all
// when eager), and takes what is already buffered even once that is over.
// An eager batch is what arrived while the one before it was applied.
// onIdle (nil: none) runs when no message is in hand at once, before the
// wait for the first.
func Collect(iter jetstream.MessagesContext, idle, wait time.Duration, size int, eager bool, onIdle func()) ([]jetstream.Msg, error) {
	first, err := iter.Next(jetstream.NextMaxWait(drained))
	if errors.Is(err, nats.ErrTimeout) {
		if onIdle != nil {
			onIdle()
		}
		first, err = iter.Next(jetstream.NextMaxWait(idle))
	}
	if err != nil {
		if errors.Is(err, nats.ErrTimeout) {
			return nil, nil
		}
		return nil, err
	}
	// Grown as messages come: sized to size, each pull would allocate a
	// slice for a whole transaction's worth of messages (10000 by
	// default), a garbage the collector pays for hundreds of times a
	// second under a stream of small batches.
	msgs := make([]jetstream.Msg, 1, min(size, 64))
	msgs[0] = first
	if eager {
		wait = 0
	}
	deadline := time.Now().Add(wait)
	for len(msgs) < size {
		m, err := iter.Next(jetstream.NextMaxWait(max(time.Until(deadline), drained)))
		if err != nil {
			if errors.Is(err, nats.ErrTimeout) {
				break
			}
			return msgs, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}
