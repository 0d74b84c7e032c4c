package main

import (
	"cmp"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/bench"
	"github.com/allot-dev/allot/internal/loadgen"
	"github.com/allot-dev/allot/internal/tracing"
	"github.com/allot-dev/allot/internal/wire"
)

// receiver is an OTLP/HTTP trace receiver that counts what it is sent and
// discards it.
type receiver struct {
	srv                    *httptest.Server
	requests, bytes, spans atomic.Int64
}

func newReceiver() *receiver {
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			if z, err := gzip.NewReader(req.Body); err == nil {
				body = z
			}
		}
		data, _ := io.ReadAll(body)
		r.requests.Add(1)
		r.bytes.Add(int64(len(data)))
		var m coltrace.ExportTraceServiceRequest
		if proto.Unmarshal(data, &m) == nil {
			for _, rs := range m.ResourceSpans {
				for _, ss := range rs.ScopeSpans {
					r.spans.Add(int64(len(ss.Spans)))
				}
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	return r
}

// exported is what the receiver got so far.
func (r *receiver) exported() (requests, bytes, spans int64) {
	return r.requests.Load(), r.bytes.Load(), r.spans.Load()
}

// tracingEnv turns tracing on, every trace sampled, exporting to r; off
// (r nil), it clears whatever the bench's own environment says.
func tracingEnv(r *receiver) []string {
	if r == nil {
		return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="}
	}
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.srv.URL, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_TRACES_SAMPLER=always_on", "OTEL_SDK_DISABLED="}
}

// tracingBench is -tracing: the end-to-end burst and the hot join drain,
// each with tracing off and on in the same run, in -repeat rounds that
// alternate which goes first; the medians are reported.
func tracingBench(ctx context.Context, o opts) error {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	recv := newReceiver()
	defer recv.srv.Close()
	rounds := max(o.repeat, 1)
	fmt.Fprintf(os.Stderr, "bench: tracing off and on, %d rounds, %d requests per measurement\n", rounds, o.n)

	type burstRun struct {
		rep loadgen.Report
		cpu time.Duration // the stack's, over its life
	}
	var bursts [2][]burstRun // [0] off, [1] on
	var drains [2][]bench.DrainResult
	var burstExp, drainExp [3]int64 // requests, bytes, spans of the "on" runs
	add := func(to *[3]int64, before [3]int64) {
		q, b, s := recv.exported()
		to[0] += q - before[0]
		to[1] += b - before[1]
		to[2] += s - before[2]
	}
	snap := func() [3]int64 { q, b, s := recv.exported(); return [3]int64{q, b, s} }

	burst := func(on bool) error {
		var r *receiver
		if on {
			r = recv
		}
		s, url, done, err := startStack(ctx, o, tracingEnv(r))
		if err != nil {
			return err
		}
		defer done()
		before := snap()
		rep, err := loadgen.Run(ctx, burstConfig(o, url), loadgen.Deps{})
		s.stop() // flushes the spans still batched
		if err != nil {
			return err
		}
		if err := rep.Verdict(); err != nil {
			return fmt.Errorf("burst verdict: %w", err)
		}
		if on {
			add(&burstExp, before)
		}
		bursts[b2i(on)] = append(bursts[b2i(on)], burstRun{rep, s.cpu()})
		fmt.Fprintf(os.Stderr, "  burst, tracing %s: last result after %s\n", onOff(on), rep.ToLastResult.Round(time.Millisecond))
		return nil
	}
	drainOnce := func(on bool) error {
		cfg := bench.DrainConfig{Requests: o.n, Activities: 1, Capacity: 100, Op: wire.OpJoin,
			Allocator: o.allocator()}
		before := snap()
		flush := func(context.Context) error { return nil }
		if on {
			// The allocator runs in this process: set the environment the
			// child processes get and let tracing read it, as they do.
			for _, kv := range tracingEnv(recv) {
				k, v, _ := strings.Cut(kv, "=")
				os.Setenv(k, v)
			}
			var err error
			if flush, err = tracing.Setup(ctx, "allot-bench"); err != nil {
				return err
			}
		}
		res, err := drain(ctx, o, log, cfg)
		if on {
			ferr := flush(context.Background())
			for _, kv := range tracingEnv(recv) {
				k, _, _ := strings.Cut(kv, "=")
				os.Unsetenv(k)
			}
			if err == nil {
				err = ferr
			}
			add(&drainExp, before)
		}
		if err != nil {
			return err
		}
		drains[b2i(on)] = append(drains[b2i(on)], res)
		fmt.Fprintf(os.Stderr, "  drain, tracing %s: %.0f decisions/s\n", onOff(on), res.PerSecond())
		return nil
	}
	// A small drain warms MySQL up; it is not reported.
	if _, err := drain(ctx, o, log, bench.DrainConfig{Requests: 2000, Activities: 1, Capacity: 100, Op: wire.OpJoin,
		Allocator: o.allocator()}); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	for i := range rounds {
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, on := range order {
			if err := burst(on); err != nil {
				return fmt.Errorf("burst, tracing %s: %w", onOff(on), err)
			}
			if err := drainOnce(on); err != nil {
				return fmt.Errorf("drain, tracing %s: %w", onOff(on), err)
			}
		}
	}

	var mb [2]loadgen.Report
	var cpu [2]time.Duration
	var md [2]bench.DrainResult
	for k := range 2 {
		b := medianOf(bursts[k], func(r burstRun) float64 { return r.rep.ToLastResult.Seconds() })
		mb[k], cpu[k] = b.rep, b.cpu
		md[k] = medianOf(drains[k], func(r bench.DrainResult) float64 { return r.PerSecond() })
	}
	fmt.Printf("\n== tracing: off vs on (OTEL_TRACES_SAMPLER=always_on, OTLP/HTTP to an in-process receiver that discards), median of %d alternating rounds ==\n", rounds)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "measurement\toff\ton\ton / off\texported while on (per round)\t")
	perRound := func(e [3]int64) string {
		r := int64(rounds)
		return fmt.Sprintf("%d spans, %d kB in %d requests", e[2]/r, e[1]/r/1000, e[0]/r)
	}
	fmt.Fprintf(tw, "burst (%d claims, HTTP): last result after\t%s\t%s\t%.2f\t%s\t\n", o.n,
		mb[0].ToLastResult.Round(time.Millisecond), mb[1].ToLastResult.Round(time.Millisecond),
		mb[1].ToLastResult.Seconds()/mb[0].ToLastResult.Seconds(), perRound(burstExp))
	fmt.Fprintf(tw, "burst: p50 time to result\t%s\t%s\t%.2f\t\t\n", mb[0].P50.Round(100*time.Microsecond), mb[1].P50.Round(100*time.Microsecond),
		mb[1].P50.Seconds()/mb[0].P50.Seconds())
	fmt.Fprintf(tw, "burst: p99 time to result\t%s\t%s\t%.2f\t\t\n", mb[0].P99.Round(100*time.Microsecond), mb[1].P99.Round(100*time.Microsecond),
		mb[1].P99.Seconds()/mb[0].P99.Seconds())
	fmt.Fprintf(tw, "burst: CPU s of the stack process\t%.2f\t%.2f\t%.2f\t\t\n", cpu[0].Seconds(), cpu[1].Seconds(), cpu[1].Seconds()/cpu[0].Seconds())
	fmt.Fprintf(tw, "drain (%d joins, one hot activity): decisions/s\t%.0f\t%.0f\t%.2f\t%s\t\n", o.n,
		md[0].PerSecond(), md[1].PerSecond(), md[1].PerSecond()/md[0].PerSecond(), perRound(drainExp))
	tw.Flush()
	fmt.Printf("burst per claim while on: %.1f spans, %.0f bytes of OTLP\n",
		float64(burstExp[2])/float64(int64(rounds)*int64(o.n)), float64(burstExp[1])/float64(int64(rounds)*int64(o.n)))
	fmt.Println("the drain publishes straight into the stream, without ingest: its requests carry no trace context, and the allocator")
	fmt.Println("starts no span for a batch without a traced request, so \"on\" there is the untraced path with tracing enabled (header checks only)")
	return nil
}

// medianOf is the element of runs with the median key.
func medianOf[T any](runs []T, key func(T) float64) T {
	runs = slices.Clone(runs)
	slices.SortFunc(runs, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return runs[len(runs)/2]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
