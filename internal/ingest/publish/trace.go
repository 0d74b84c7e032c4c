package publish

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/allot-dev/allot/internal/tracing"
	"github.com/allot-dev/allot/internal/wire"
)

// tracePublish starts the span of one request's publish (its wait in the
// group commit and for the PubAck) and writes its context into the request
// message's headers, which carry it to the allocator.
func tracePublish(ctx context.Context, msg *nats.Msg, id string, activity int64) (context.Context, trace.Span) {
	if !tracing.Enabled() || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, nil
	}
	ctx, span := tracing.Tracer().Start(ctx, "publish "+wire.RequestStream, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", msg.Subject),
			attribute.String("allot.request_id", id), attribute.Int64("allot.activity_id", activity)))
	tracing.Inject(ctx, msg.Header)
	return ctx, span
}

// endPublish ends the span tracePublish started.
func endPublish(span trace.Span, ack *jetstream.PubAck, st Stored, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "publish failed")
	} else if ack != nil {
		span.SetAttributes(attribute.Int64("allot.seq", int64(wire.SeqOf(st.Place))),
			attribute.Int("allot.index", wire.IndexOf(st.Place)), attribute.Bool("allot.sole", st.Sole),
			attribute.Bool("allot.duplicate", ack.Duplicate))
	}
	span.End()
}

// links are the publish spans of the traced requests of m.
func links(m *outMsg) []trace.Link {
	var ls []trace.Link
	for _, r := range m.reqs {
		if sc := tracing.Remote(r.msg.Header); sc.IsValid() {
			ls = append(ls, trace.Link{SpanContext: sc})
		}
	}
	return ls
}

// traceBatch gives a batch message a span of its own, linked to the
// publish span of every traced request in it (each request keeps its own
// trace), and writes its context into the message's headers, which carry
// it to the allocator.
func traceBatch(m *outMsg) {
	if !tracing.Enabled() {
		return
	}
	ls := links(m)
	if len(ls) == 0 {
		return
	}
	ctx, span := tracing.Tracer().Start(context.Background(), "publish batch "+wire.RequestStream,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(ls...),
		trace.WithAttributes(attribute.String("messaging.destination.name", m.msg.Subject),
			attribute.Int("messaging.batch.message_count", len(m.reqs))))
	tracing.Inject(ctx, m.msg.Header)
	span.End()
}

// traceGroup starts the span of one atomic batch of the group commit,
// linked to the publish span of every traced request in it; the returned
// function ends it.
func traceGroup(msgs []*outMsg) func() {
	if !tracing.Enabled() {
		return func() {}
	}
	var ls []trace.Link
	n := 0
	for _, m := range msgs {
		ls = append(ls, links(m)...)
		n += len(m.reqs)
	}
	if len(ls) == 0 {
		return func() {}
	}
	_, span := tracing.Tracer().Start(context.Background(), "group commit "+wire.RequestStream,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(ls...),
		trace.WithAttributes(attribute.Int("messaging.batch.message_count", len(msgs)),
			attribute.Int("allot.requests", n)))
	return func() { span.End() }
}
