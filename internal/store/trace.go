package store

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/allot-dev/allot/internal/tracing"
)

// traceCommit starts the span of a transaction's COMMIT when ctx is traced
// (docs/tracing.md); the returned function ends it with commit's error.
func traceCommit(ctx context.Context) func(error) {
	if !tracing.Enabled() || !trace.SpanContextFromContext(ctx).IsValid() {
		return func(error) {}
	}
	_, span := tracing.Tracer().Start(ctx, "mysql commit", trace.WithSpanKind(trace.SpanKindClient))
	return func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "commit failed")
		}
		span.End()
	}
}
