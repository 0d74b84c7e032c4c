// Package spans makes the allocator's trace spans: one per batch, one per
// MySQL transaction, one per traced request's decision.
package spans

import (
	"context"

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

// Batch starts the span of one batch of partition, or returns ctx
// unchanged when no request in it is traced.
func Batch(ctx context.Context, msgs []jetstream.Msg, partition int) (context.Context, func()) {
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
			attribute.Int("allot.partition", partition)))
	return ctx, func() { span.End() }
}

// Tx starts the span of one MySQL transaction of the batch in ctx.
func Tx(ctx context.Context) (context.Context, func()) {
	if !tracing.Enabled() || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, func() {}
	}
	ctx, span := tracing.Tracer().Start(ctx, "allocator transaction",
		trace.WithAttributes(attribute.String("db.system.name", "mysql")))
	return ctx, func() { span.End() }
}

// Decision records the decision on one traced request (msg, at seq): a
// span in the request's trace, linked to the batch (ctx). It returns the
// span's context, invalid when the request is not traced.
func Decision(ctx context.Context, msg jetstream.Msg, seq uint64, res wire.Result, events int) trace.SpanContext {
	if !tracing.Enabled() || msg == nil {
		return trace.SpanContext{}
	}
	remote := tracing.Remote(msg.Headers())
	if !remote.IsValid() {
		return trace.SpanContext{}
	}
	batch := trace.SpanContextFromContext(ctx)
	var opts []trace.SpanStartOption
	if batch.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: batch}))
	}
	opts = append(opts, trace.WithAttributes(
		attribute.String("allot.request_id", res.RequestID), attribute.String("allot.op", string(res.Op)),
		attribute.Int64("allot.activity_id", res.ActivityID), attribute.String("allot.outcome", string(res.Outcome)),
		attribute.Int64("allot.seq", int64(seq)), attribute.Int("allot.index", res.Index), attribute.Int("allot.events", events)))
	_, span := tracing.Tracer().Start(trace.ContextWithRemoteSpanContext(context.Background(), remote), "allocator decide", opts...)
	span.End()
	return span.SpanContext()
}
