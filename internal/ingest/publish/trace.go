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
func endPublish(span trace.Span, ack *jetstream.PubAck, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "publish failed")
	} else if ack != nil {
		span.SetAttributes(attribute.Int64("allot.seq", int64(ack.Sequence)), attribute.Bool("allot.duplicate", ack.Duplicate))
	}
	span.End()
}

// traceGroup starts the span of one atomic batch of the group commit,
// linked to the publish span of every traced request in it (each request
// keeps its own trace); the returned function ends it.
func traceGroup(group []*pubRequest) func() {
	if !tracing.Enabled() {
		return func() {}
	}
	var links []trace.Link
	for _, r := range group {
		if sc := tracing.Remote(r.msg.Header); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	if len(links) == 0 {
		return func() {}
	}
	_, span := tracing.Tracer().Start(context.Background(), "group commit "+wire.RequestStream,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("messaging.batch.message_count", len(group))))
	return func() { span.End() }
}
