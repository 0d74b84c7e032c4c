package tracing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/stacktest"
	"github.com/allot-dev/allot/internal/tracing"
)

// BenchmarkBurstTracing sends a burst of joins through HTTP (ingest, group
// commit, allocator, relay) with tracing off and with every request traced
// and exported by OTLP/HTTP to an in-process receiver that discards, in the
// same run. Compare the two joins/s figures:
//
//	go test -run '^$' -bench BurstTracing -benchtime 3x ./internal/tracing
func BenchmarkBurstTracing(b *testing.B) {
	if testing.Short() {
		b.Skip("benchmark")
	}
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			var exported atomic.Int64
			if on {
				recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n, _ := io.Copy(io.Discard, r.Body)
					exported.Add(n)
					w.Header().Set("Content-Type", "application/x-protobuf")
					w.WriteHeader(http.StatusOK)
				}))
				b.Cleanup(recv.Close)
				exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(recv.URL+"/v1/traces"))
				if err != nil {
					b.Fatal(err)
				}
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
				restore := tracing.Use(tp)
				b.Cleanup(func() {
					restore()
					tp.Shutdown(context.Background()) //nolint:errcheck
				})
			}
			st := stacktest.Start(b, config.Defaults[allocator.Config](), stacktest.IngestConfig(), ingest.Deps{})
			cl := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			b.Cleanup(cl.CloseIdleConnections)
			const joins, clients = 2000, 64
			var total time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				activity := 100 + i
				burstDo(b, cl, http.MethodPut, fmt.Sprintf("%s/v1/activities/%d?wait=10s", st.URL, activity), `{"capacity": 100}`)
				b.StartTimer()
				start := time.Now()
				var wg sync.WaitGroup
				next := atomic.Int64{}
				for range clients {
					wg.Go(func() {
						for u := next.Add(1); u <= joins; u = next.Add(1) {
							burstDo(b, cl, http.MethodPost, fmt.Sprintf("%s/v1/activities/%d/signups/%d?wait=10s", st.URL, activity, u), "")
						}
					})
				}
				wg.Wait()
				total += time.Since(start)
			}
			b.ReportMetric(float64(joins*b.N)/total.Seconds(), "joins/s")
			if on {
				b.ReportMetric(float64(exported.Load())/float64(joins*b.N), "otlp-bytes/join")
			}
		})
	}
}

func burstDo(b *testing.B, cl *http.Client, method, url, body string) {
	req, err := http.NewRequest(method, url, nil)
	if body != "" {
		req, err = http.NewRequest(method, url, strings.NewReader(body))
	}
	if err != nil {
		b.Error(err)
		return
	}
	resp, err := cl.Do(req)
	if err != nil {
		b.Error(err)
		return
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Errorf("%s %s: %d", method, url, resp.StatusCode)
	}
}
