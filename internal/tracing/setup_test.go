package tracing_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/allot-dev/allot/internal/tracing"
)

func TestSetupFromEnvironment(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SDK_DISABLED"} {
		t.Setenv(k, "")
	}
	ctx := context.Background()

	stop, err := tracing.Setup(ctx, "allot-test")
	if err != nil || tracing.Enabled() {
		t.Fatalf("no endpoint: err %v, enabled %v; want off", err, tracing.Enabled())
	}
	stop(ctx) //nolint:errcheck

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if _, err := tracing.Setup(ctx, "allot-test"); err != nil || tracing.Enabled() {
		t.Fatalf("OTEL_SDK_DISABLED: err %v, enabled %v; want off", err, tracing.Enabled())
	}
	t.Setenv("OTEL_SDK_DISABLED", "")

	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	if _, err := tracing.Setup(ctx, "allot-test"); err == nil || !strings.Contains(err.Error(), "http/protobuf") || tracing.Enabled() {
		t.Fatalf("grpc: err %v, enabled %v; want a refusal naming http/protobuf", err, tracing.Enabled())
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")

	stop, err = tracing.Setup(ctx, "allot-test")
	if err != nil || !tracing.Enabled() {
		t.Fatalf("endpoint set: err %v, enabled %v; want on", err, tracing.Enabled())
	}
	stop(ctx) //nolint:errcheck // nothing listens on the endpoint; no span was started
	if tracing.Enabled() {
		t.Fatal("still enabled after shutdown")
	}
}

func TestLogLinesCarryTraceIDs(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	t.Cleanup(tracing.Use(tp))
	var buf bytes.Buffer
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil))).With("binary", "x")
	ctx, span := tracing.Tracer().Start(context.Background(), "op")
	log.InfoContext(ctx, "traced")
	span.End()
	log.Info("untraced")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines %q", lines)
	}
	want := `"trace_id":"` + span.SpanContext().TraceID().String() + `","span_id":"` + span.SpanContext().SpanID().String() + `"`
	if !strings.Contains(lines[0], want) {
		t.Errorf("traced line %s, want %s", lines[0], want)
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("untraced line %s has a trace id", lines[1])
	}
}
