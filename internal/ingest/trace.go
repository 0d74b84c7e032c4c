package ingest

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/allot-dev/allot/internal/tracing"
)

// Traces (docs/tracing.md). With tracing off every helper here returns at
// once and the handler is not wrapped.

// traced wraps the API in a server span per request (extracting a caller's
// traceparent), named after the route pattern it matched (nameSpan too).
func traced(h http.Handler) http.Handler {
	if !tracing.Enabled() {
		return h
	}
	return otelhttp.NewHandler(h, "ingest",
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if r.Pattern != "" {
				return r.Pattern // the route matched: a name from a fixed set
			}
			return r.Method
		}))
}

// nameSpan names the request's span after its route label ("POST
// /v1/activities/{activity}/signups/{user}"), never the raw path, so that
// span names stay few.
func nameSpan(r *http.Request, label string) {
	if !tracing.Enabled() {
		return // no span to name, and no context chain to walk for it
	}
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	span.SetName(label)
	span.SetAttributes(attribute.String("http.route", label))
}
