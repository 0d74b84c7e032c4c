// Package pull is the allocator's apply loop's pull on its partition's
// consumer: the feed in use, and collecting the next batch from it.
package pull

import (
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Feed reads a consumer's message iterator on a goroutine of its own into
// a buffer that Collect can look into without a timer. The iterator's own
// Next cannot say "nothing is buffered" reliably: it starts its timer
// before its bookkeeping, so under a busy core a short wait times out with
// messages in hand, and the runtime rounds a wait under a millisecond up
// to one when it has nothing else to run.
type Feed struct {
	iter  jetstream.MessagesContext
	items chan item
	done  chan struct{}
	once  sync.Once
}

type item struct {
	m   jetstream.Msg
	err error
}

// newFeed starts reading iter into a buffer of up to buffer messages.
func newFeed(iter jetstream.MessagesContext, buffer int) *Feed {
	f := &Feed{iter: iter, items: make(chan item, max(buffer, 1)), done: make(chan struct{})}
	go f.read()
	return f
}

// Open starts a feed on cons, in priority group group, that reads up to
// prefetch messages ahead of Collect: half in the iterator's buffer, half
// in the feed's.
func Open(cons jetstream.Consumer, group string, prefetch int) (*Feed, error) {
	half := max(prefetch/2, 1)
	iter, err := cons.Messages(jetstream.PullMaxMessages(half), jetstream.PullPriorityGroup(group))
	if err != nil {
		return nil, err
	}
	return newFeed(iter, half), nil
}

func (f *Feed) read() {
	for {
		m, err := f.iter.Next()
		select {
		case f.items <- item{m, err}:
		case <-f.done:
			return
		}
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return
		}
	}
}

// Stop stops the iterator and the goroutine reading it. What was read but
// not collected is left unacknowledged, as what the iterator buffered is:
// redelivered after AckWait, or read from the stream by the next owner
// filling the gap. It may be called from any goroutine, more than once.
func (f *Feed) Stop() {
	f.once.Do(func() {
		f.iter.Stop()
		close(f.done)
	})
}

// buffered takes the next message read already, if any; it lets the
// reading goroutine run once first, so that a message the iterator holds
// is counted as buffered. ok is false when there is none.
func (f *Feed) buffered() (it item, ok bool) {
	for yielded := false; ; yielded = true {
		select {
		case it = <-f.items:
			return it, true
		case <-f.done:
			return item{err: jetstream.ErrMsgIteratorClosed}, true
		default:
		}
		if yielded {
			return item{}, false
		}
		runtime.Gosched()
	}
}

// within waits up to d for the next message; ok is false when none came.
func (f *Feed) within(d time.Duration) (it item, ok bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case it = <-f.items:
		return it, true
	case <-f.done:
		return item{err: jetstream.ErrMsgIteratorClosed}, true
	case <-t.C:
		return item{}, false
	}
}

// Puller is the apply loop's feed on the consumer; its Stop may come from
// another goroutine (the loop's context ending).
type Puller struct {
	mu   sync.Mutex
	feed *Feed
}

func (p *Puller) Current() *Feed {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.feed
}

func (p *Puller) Set(f *Feed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.feed = f
}

// Forget drops f, stopped, unless another feed replaced it.
func (p *Puller) Forget(f *Feed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f.Stop()
	if p.feed == f {
		p.feed = nil
	}
}

func (p *Puller) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.feed != nil {
		p.feed.Stop()
		p.feed = nil
	}
}

// Collect returns the next batch of at most size messages: it waits up to
// idle for a first message, then up to wait more for the rest (not at all
// when eager), and takes what is already buffered even once that is over.
// An eager batch is what arrived while the one before it was applied.
// onIdle (nil: none) runs when no message is buffered, before the wait for
// the first. The error is the iterator's (jetstream.ErrMsgIteratorClosed
// once the feed is stopped), with the messages taken before it.
func Collect(f *Feed, idle, wait time.Duration, size int, eager bool, onIdle func()) ([]jetstream.Msg, error) {
	first, ok := f.buffered()
	if !ok {
		if onIdle != nil {
			onIdle()
		}
		if first, ok = f.within(idle); !ok {
			return nil, nil
		}
	}
	if first.err != nil {
		return nil, first.err
	}
	// Grown as messages come: sized to size, each pull would allocate a
	// slice for a whole transaction's worth of messages (10000 by
	// default), a garbage the collector pays for hundreds of times a
	// second under a stream of small batches.
	msgs := make([]jetstream.Msg, 1, min(size, 64))
	msgs[0] = first.m
	if eager {
		wait = 0
	}
	deadline := time.Now().Add(wait)
	for len(msgs) < size {
		it, ok := f.buffered()
		if !ok {
			d := time.Until(deadline)
			if d <= 0 {
				break
			}
			if it, ok = f.within(d); !ok {
				break
			}
		}
		if it.err != nil {
			return msgs, it.err
		}
		msgs = append(msgs, it.m)
	}
	return msgs, nil
}
