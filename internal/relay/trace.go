package relay

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/allot-dev/allot/internal/tracing"
	"github.com/allot-dev/allot/internal/wire"
)

// Traces (docs/tracing.md): the relay learns a request's decision span
// from the allocator (NoteDecision), in memory, and makes each of its
// events' publish spans a child of it. An event relayed by another
// process, or after a restart, starts a trace of its own.

// NoteDecision remembers the decision span of a traced request that has
// events, for their publish spans.
func (r *Relay) NoteDecision(requestID string, sc trace.SpanContext) { r.book.put(requestID, sc) }

// traceBookMax bounds the decisions remembered for the relay; past it the
// book starts over (those events are relayed in traces of their own).
const traceBookMax = 1 << 16

// traceBook maps a request id to its decision span, for the relay.
type traceBook struct {
	mu sync.Mutex
	m  map[string]trace.SpanContext
}

func (b *traceBook) put(id string, sc trace.SpanContext) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil || len(b.m) >= traceBookMax {
		b.m = make(map[string]trace.SpanContext)
	}
	b.m[id] = sc
}

func (b *traceBook) get(id string) trace.SpanContext {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[id]
}

func (b *traceBook) drop(ids []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		delete(b.m, id)
	}
}

// relayTrace holds the publish spans of one relay pass.
type relayTrace struct {
	book  *traceBook
	spans []trace.Span
	ids   []string
}

// traceRelay begins a relay pass's tracing; nil when tracing is off.
func (r *Relay) traceRelay() *relayTrace {
	if !tracing.Enabled() {
		return nil
	}
	return &relayTrace{book: &r.book}
}

// event starts the publish span of ev, a child of its request's decision,
// and writes its context into msg's headers, for the notifier.
func (t *relayTrace) event(ev wire.Event, msg *nats.Msg) {
	if t == nil {
		return
	}
	sc := t.book.get(ev.RequestID)
	if !sc.IsValid() {
		return
	}
	ctx, span := tracing.Tracer().Start(trace.ContextWithRemoteSpanContext(context.Background(), sc),
		"publish "+wire.EventStream, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", msg.Subject),
			attribute.String("allot.event_id", ev.EventID), attribute.String("allot.kind", string(ev.Kind)),
			attribute.String("allot.request_id", ev.RequestID)))
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	tracing.Inject(ctx, msg.Header)
	t.spans = append(t.spans, span)
	t.ids = append(t.ids, ev.RequestID)
}

// end ends the pass's spans and forgets their requests.
func (t *relayTrace) end() {
	if t == nil {
		return
	}
	for _, s := range t.spans {
		s.End()
	}
	t.book.drop(t.ids)
}
