package notifier

import (
	"context"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/allot-dev/allot/internal/tracing"
)

// Traces (docs/tracing.md): an event that carries a trace context gets a
// delivery span in that trace, and each webhook attempt a client span
// under it, whose context goes to the receiver in a traceparent header.

// traceEvent starts the delivery span of msg when it is traced.
func traceEvent(ctx context.Context, msg jetstream.Msg) (context.Context, func()) {
	if !tracing.Enabled() {
		return ctx, func() {}
	}
	rctx := tracing.Extract(ctx, msg.Headers())
	if !trace.SpanContextFromContext(rctx).IsValid() {
		return ctx, func() {}
	}
	ctx, span := tracing.Tracer().Start(rctx, "deliver "+msg.Subject(), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", msg.Subject())))
	return ctx, func() { span.End() }
}

// traceWebhook starts the span of one webhook attempt and puts its context
// into the request's headers.
func traceWebhook(req *http.Request) (*http.Request, trace.Span) {
	if !tracing.Enabled() || !trace.SpanContextFromContext(req.Context()).IsValid() {
		return req, nil
	}
	ctx, span := tracing.Tracer().Start(req.Context(), "webhook POST", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("http.request.method", req.Method),
			attribute.String("server.address", req.URL.Host)))
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	return req.WithContext(ctx), span
}

// endWebhook ends the span of a webhook attempt with its outcome.
func endWebhook(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, attemptOutcome(err))
	}
	span.End()
}
