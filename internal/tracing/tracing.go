// Package tracing sets up OpenTelemetry traces from the standard OTEL_
// environment variables and carries the W3C trace context through NATS
// message headers.
//
// Tracing is on only when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (and OTEL_SDK_DISABLED is not
// true). Off, the global tracer provider stays OpenTelemetry's no-op one,
// no propagator is installed and Enabled reports false, so that callers
// skip the wrapping and the header work altogether.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/allot-dev/allot/internal/buildinfo"
)

// Scope is the instrumentation scope of every span allot starts.
const Scope = "github.com/allot-dev/allot"

var enabled atomic.Bool

// Enabled reports whether a tracer provider that records spans is
// installed.
func Enabled() bool { return enabled.Load() }

// Tracer is allot's tracer from the global provider.
func Tracer() trace.Tracer { return otel.Tracer(Scope) }

// Configured reports whether the environment asks for traces.
func Configured() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs, when the environment asks for traces, a tracer provider
// exporting by OTLP over HTTP/protobuf, for the service named service
// (OTEL_SERVICE_NAME overrides it). Sampling follows OTEL_TRACES_SAMPLER
// and OTEL_TRACES_SAMPLER_ARG (default parentbased_always_on), the
// exporter the other OTEL_EXPORTER_OTLP_ variables. The returned function
// flushes and shuts the provider down; it is never nil.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	nothing := func(context.Context) error { return nil }
	if !Configured() {
		return nothing, nil
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto != "" && proto != "http/protobuf" {
		return nothing, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: this build exports traces by http/protobuf only (port 4318 on most collectors)", proto)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nothing, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", service),
			attribute.String("service.version", buildinfo.Read().Version)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
	)
	if err != nil && res == nil {
		return nothing, fmt.Errorf("trace resource: %w", err)
	}
	// The sampler is the SDK's default, which reads OTEL_TRACES_SAMPLER.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	restore := Use(tp)
	return func(ctx context.Context) error {
		restore()
		return errors.Join(tp.ForceFlush(ctx), tp.Shutdown(ctx))
	}, nil
}

// Use installs tp as the global tracer provider, with the W3C trace
// context and baggage propagators, and marks tracing enabled; the
// returned function puts the no-op provider back. Setup uses it; so do
// tests with an in-memory exporter.
func Use(tp trace.TracerProvider) (restore func()) {
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	enabled.Store(true)
	return func() {
		enabled.Store(false)
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	}
}

// HeaderCarrier is a propagation.TextMapCarrier over NATS message headers.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string { return nats.Header(c).Get(key) }

// Set sets key to value.
func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys lists the keys present.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the trace context of ctx into h (traceparent, tracestate).
// It does nothing when tracing is off or ctx carries no valid span.
func Inject(ctx context.Context, h nats.Header) {
	if h == nil || !Enabled() || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	otel.GetTextMapPropagator().Inject(ctx, HeaderCarrier(h))
}

// Extract returns ctx with the remote span context carried in h, if any.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if len(h) == 0 || !Enabled() {
		return ctx
	}
	if h.Get("traceparent") == "" {
		return ctx // the common case when the sender traced nothing
	}
	return otel.GetTextMapPropagator().Extract(ctx, HeaderCarrier(h))
}

// Remote is the span context carried in h (invalid when there is none).
func Remote(h nats.Header) trace.SpanContext {
	return trace.SpanContextFromContext(Extract(context.Background(), h))
}

// Flush runs shutdown (from Setup) within five seconds, logging what it
// could not export. A binary defers it, so that spans are flushed on exit.
func Flush(shutdown func(context.Context) error, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil && log != nil {
		log.Warn("flush traces", slog.Any("err", err))
	}
}
