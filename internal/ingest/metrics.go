package ingest

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are ingest's Prometheus series.
type metrics struct {
	requests        *prometheus.CounterVec // route, code
	publishDuration prometheus.Histogram
	publishFailures prometheus.Counter
	replays         prometheus.Counter
	waiters         prometheus.Gauge
	shed            *prometheus.CounterVec // outcome
	earlyMissed     *prometheus.CounterVec // reason
	commitBatch     prometheus.Histogram
	resultQueries   prometheus.Counter
	tailWait        prometheus.Histogram
	waitersRefused  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_ingest_http_requests_total",
			Help: "HTTP requests answered, by route pattern and status code.",
		}, []string{"route", "code"}),
		publishDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "allot_ingest_publish_duration_seconds",
			Help:    "Time from publishing a request to its JetStream PubAck (or failure).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5ms .. 4s
		}),
		publishFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allot_ingest_publish_failures_total",
			Help: "Requests that JetStream did not store (answered 503).",
		}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allot_ingest_idempotent_replays_total",
			Help: "Writes answered with the request id of an earlier use of their Idempotency-Key.",
		}),
		waiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "allot_ingest_waiters",
			Help: "HTTP handlers waiting for a request's result (?wait=).",
		}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_ingest_shed_claims_total",
			Help: "Claims for a full activity answered before the allocator applied them, by outcome.",
		}, []string{"outcome"}),
		commitBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "allot_ingest_commit_batch_size",
			Help:    "Requests published together as one atomic batch (group commit).",
			Buckets: prometheus.ExponentialBuckets(16, 2, 7),
		}),
		tailWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "allot_ingest_tail_wait_seconds",
			Help:    "Time from a claim's PubAck until this ingest's tail of the request stream passed it (early answers).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
		resultQueries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allot_ingest_result_queries_total",
			Help: "MySQL queries that read results for polls and waiting handlers (each gathers up to 500 reads).",
		}),
		waitersRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allot_ingest_waiters_refused_total",
			Help: "Writes and polls with ?wait= answered 503 because ALLOT_INGEST_MAX_WAITERS handlers were already waiting.",
		}),
		earlyMissed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_ingest_shed_missed_total",
			Help: "Claims for an activity with a view that were left to the allocator: the stream held a change after the view (changed), or the tail did not pass the claim in time (tail_behind).",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.publishDuration, m.publishFailures, m.replays, m.waiters, m.shed, m.earlyMissed, m.commitBatch, m.resultQueries, m.waitersRefused, m.tailWait} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("ingest: register metrics: %w", err)
		}
	}
	return m, nil
}

// codeLabels holds the label text of every status code, so that counting a
// request does not format a number.
var codeLabels = func() (t [600]string) {
	for i := 100; i < len(t); i++ {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

func codeLabel(code int) string {
	if code >= 100 && code < len(codeLabels) {
		return codeLabels[code]
	}
	return strconv.Itoa(code)
}

// countRequest counts one answered request under the route's pattern.
func (m *metrics) countRequest(route string, code int) {
	if code == 0 {
		code = http.StatusOK
	}
	m.requests.WithLabelValues(route, codeLabel(code)).Inc()
}
