package allocator

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/allot-dev/allot/internal/tracing"
	"github.com/allot-dev/allot/internal/wire"
)

// Traces (docs/tracing.md). A batch's span joins the trace of the first
// traced request in it and links to the others; each traced request gets a
// decision span in its own trace, linked to the batch. The relay learns a
// request's decision span from traceBook, in memory: an event relayed by
// another process, or after a restart, starts a trace of its own.

// traceBatch starts the span of one batch, or returns ctx unchanged when
// no request in it is traced.
func (a *Allocator) traceBatch(ctx context.Context, msgs []jetstream.Msg) (context.Context, func()) {
	if !tracing.Enabled() {
		return ctx, func() {}
	}
	var parent trace.SpanContext
	var links []trace.Link
	for _, m := range msgs {
		sc := tracing.Remote(m.Headers())
		switch {
		case !sc.IsValid():
		case !parent.IsValid():
			parent = sc
		default:
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	if !parent.IsValid() {
		return ctx, func() {}
	}
	ctx, span := tracing.Tracer().Start(trace.ContextWithRemoteSpanContext(ctx, parent), "allocator batch",
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("messaging.batch.message_count", len(msgs)),
			attribute.Int("allot.partition", a.cfg.Partition)))
	return ctx, func() { span.End() }
}

// traceTx starts the span of one MySQL transaction of the batch in ctx.
func traceTx(ctx context.Context) (context.Context, func()) {
	if !tracing.Enabled() || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, func() {}
	}
	ctx, span := tracing.Tracer().Start(ctx, "allocator transaction",
		trace.WithAttributes(attribute.String("db.system.name", "mysql")))
	return ctx, func() { span.End() }
}

// traceDecision records the decision on one traced request: a span in the
// request's trace, linked to the batch (ctx), remembered for the relay
// when the decision has events.
func (a *Allocator) traceDecision(ctx context.Context, it item, res wire.Result, events int) {
	if !tracing.Enabled() || it.msg == nil {
		return
	}
	remote := tracing.Remote(it.msg.Headers())
	if !remote.IsValid() {
		return
	}
	batch := trace.SpanContextFromContext(ctx)
	var opts []trace.SpanStartOption
	if batch.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: batch}))
	}
	opts = append(opts, trace.WithAttributes(
		attribute.String("allot.request_id", res.RequestID), attribute.String("allot.op", string(res.Op)),
		attribute.Int64("allot.activity_id", res.ActivityID), attribute.String("allot.outcome", string(res.Outcome)),
		attribute.Int64("allot.seq", int64(it.seq)), attribute.Int("allot.events", events)))
	_, span := tracing.Tracer().Start(trace.ContextWithRemoteSpanContext(context.Background(), remote), "allocator decide", opts...)
	span.End()
	if events > 0 {
		a.relay.book.put(res.RequestID, span.SpanContext())
	}
}

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
