package shed

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// The tail is ingest's proof that a shed answer is the allocator's
// answer. It follows the request stream itself (an ordered consumer, so it
// sees every stored message in stream order, from every ingest and every
// other publisher) and remembers, per activity, the place of the last
// request that could change a claim's answer: anything but a claim (or a
// void, which changes no activity). It reads headers only: a message's
// wire.OpsHeader says whether it holds only claims and voids
// (wire.ChangesNoClaim), and wire.BatchHeader how many requests it holds
// (n; 1 without it). A message that holds anything else, or says nothing
// (hold expiries sourced from ALLOT_HOLDS, older publishers), counts as a
// change at its LAST place, wire.Place(seq, n-1), whichever of its
// requests is the change.
//
// On a full activity a claim changes nothing (SOLD_OUT or ALREADY_OWNED).
// A claim at place C = (s, i), with a view of the activity at place V (the
// last request applied to it), is decided by the view iff no request in
// (V, C] can change its answer. The tail has seen every message from its
// start on; once it has passed message s and seen message SeqOf(V) too, a
// change in (V, C] is in a message it has seen, and is recorded at that
// message's last place, which is at or after the change itself and so
// after V: the activity's last change is then above V. So "last change
// <= V" proves the interval holds claims alone. Being conservative costs
// only shed answers: a change anywhere in the claim's own message, even
// after the claim, counts (its last place is past C, past V), and so does
// one in the view's message before V. Views can be late, stale or lost
// without ever causing a wrong answer: each of those only sends a claim to
// the allocator.

// DefaultTailReplay is how many of the stream's latest messages the tail
// reads at start, so that views published before this ingest started can
// decide claims at once.
const DefaultTailReplay = 100_000

// tail follows the request stream; see above. It keeps the last change of
// at most ALLOT_INGEST_ACTIVITY_CACHE activities: a forgotten activity counts as
// changed at the highest place forgotten, which only sends its claims to
// the allocator.
type tail struct {
	mu sync.Mutex
	// from is the first stream sequence from which the tail has seen every
	// message, pos the last message sequence it has seen.
	from, pos uint64
	// changed maps an activity to the last place of its last message that
	// may change a claim's answer; floor stands in for the activities
	// evicted from it.
	changed *lru.Cache[int64, uint64]
	floor   uint64
	waits   seqWaits
	cc      jetstream.ConsumeContext
}

func newTail(size int) *tail {
	t := &tail{}
	// The callback runs under the cache's lock, inside t.mu (see see).
	t.changed, _ = lru.NewWithEvict(size, func(_ int64, place uint64) { t.floor = max(t.floor, place) })
	return t
}

// start follows the stream from at most replay messages back.
func (t *tail) start(ctx context.Context, js jetstream.JetStream, replay uint64, log *slog.Logger) error {
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		return fmt.Errorf("%w: %w", bus.ErrUnavailable, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", bus.ErrUnavailable, err)
	}
	from := info.State.LastSeq + 1
	if from > replay {
		from -= replay
	} else {
		from = 1
	}
	from = max(from, info.State.FirstSeq)
	t.mu.Lock()
	t.from, t.pos = from, from-1
	t.mu.Unlock()
	c, err := js.OrderedConsumer(ctx, wire.RequestStream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from,
		HeadersOnly: true, // the headers decide (see above): no body is sent
	})
	if err != nil {
		return fmt.Errorf("%w: follow %s: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	cc, err := c.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return
		}
		h := m.Headers()
		t.see(md.Sequence.Stream, m.Subject(), h.Get(wire.OpsHeader), h.Get(wire.BatchHeader))
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !errors.Is(err, jetstream.ErrNoHeartbeat) {
			log.Warn("follow the request stream", slog.Any("err", err))
		}
	}))
	if err != nil {
		return fmt.Errorf("%w: follow %s: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	t.cc = cc
	return nil
}

func (t *tail) stop() {
	if t.cc != nil {
		t.cc.Stop()
		// Stop unsubscribes in the background; a stopped Service leaves
		// no subscription behind.
		select {
		case <-t.cc.Closed():
		case <-time.After(5 * time.Second):
		}
	}
}

// see takes the message at seq with the OpsHeader ops and the
// BatchHeader batch: one that may change a claim's answer moves its
// activity's last change to its last place; every message moves pos and
// wakes the waits it passes. A message whose batch header cannot be read
// counts as a change at the last place a batch may have.
func (t *tail) see(seq uint64, subject, ops, batch string) {
	n, err := wire.BatchSize(batch)
	switch {
	case err != nil:
		n = wire.MaxBatch
	case n == 0:
		n = 1
	}
	last := wire.Place(seq, n-1)
	change := err != nil || !wire.ChangesNoClaim(ops)
	activity, err := strconv.ParseInt(wire.ActivityOfSubject(subject), 10, 64)
	t.mu.Lock()
	defer t.mu.Unlock()
	if seq <= t.pos {
		return // the ordered consumer started again behind its position
	}
	switch {
	case err != nil:
		// Not an activity's subject: it cannot be attributed, so it is
		// everybody's change.
		t.floor = max(t.floor, last)
	case change:
		t.changed.Add(activity, last)
	}
	t.pos = seq
	for len(t.waits) > 0 && t.waits[0].seq <= seq {
		close(heap.Pop(&t.waits).(*seqWait).ch)
	}
}

// settled reports whether the tail proves that no request that could
// change a claim's answer on activity was stored after the place view and
// at or before the claim's place (see above).
func (t *tail) settled(activity int64, view, claim uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pos < wire.SeqOf(claim) || wire.SeqOf(view) < t.from || view >= claim {
		return false
	}
	last, _ := t.changed.Peek(activity)
	return max(last, t.floor) <= view
}

// waitPast waits until the tail has seen the message at seq, at most d;
// it reports whether it has.
func (t *tail) waitPast(ctx context.Context, seq uint64, d time.Duration) bool {
	t.mu.Lock()
	if t.pos >= seq {
		t.mu.Unlock()
		return true
	}
	w := &seqWait{seq: seq, ch: make(chan struct{})}
	heap.Push(&t.waits, w)
	t.mu.Unlock()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-w.ch:
		return true
	case <-timer.C:
	case <-ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.index >= 0 {
		heap.Remove(&t.waits, w.index)
		return false
	}
	return true // closed meanwhile
}

// seqWait is one handler waiting for the tail to reach seq.
type seqWait struct {
	seq   uint64
	ch    chan struct{}
	index int // in seqWaits; -1 once popped
}

// seqWaits is a min-heap by seq.
type seqWaits []*seqWait

func (h seqWaits) Len() int           { return len(h) }
func (h seqWaits) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h seqWaits) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *seqWaits) Push(x any) {
	w := x.(*seqWait)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *seqWaits) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.index = -1
	return w
}
