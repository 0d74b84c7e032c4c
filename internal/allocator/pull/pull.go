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

// Collect returns the next batch of at most size messages: it waits up to
// idle for a first message, then up to wait more for the rest.
func Collect(iter jetstream.MessagesContext, idle, wait time.Duration, size int) ([]jetstream.Msg, error) {
	first, err := iter.Next(jetstream.NextMaxWait(idle))
	if err != nil {
		if errors.Is(err, nats.ErrTimeout) {
			return nil, nil
		}
		return nil, err
	}
	msgs := make([]jetstream.Msg, 1, size)
	msgs[0] = first
	deadline := time.Now().Add(wait)
	for len(msgs) < size {
		wait := time.Until(deadline)
		if wait <= 0 {
			break
		}
		m, err := iter.Next(jetstream.NextMaxWait(wait))
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
