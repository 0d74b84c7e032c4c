package ingest

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/ingest/publish"
	"github.com/allot-dev/allot/internal/ingest/reads"
	"github.com/allot-dev/allot/internal/ingest/results"
	"github.com/allot-dev/allot/internal/ingest/shed"
)

// metrics are ingest's Prometheus series, each component's in its own
// struct; all are declared and registered here, in one place.
type metrics struct {
	requests *prometheus.CounterVec // route, code
	replays  prometheus.Counter
	access   access.Metrics
	publish  publish.Metrics
	shed     shed.Metrics
	results  results.Metrics
	reads    reads.Metrics
	shardUp  *probedGauge // reads.Metrics.Up, pinged at each scrape
}

// probedGauge is a gauge vector that runs probe before each collection:
// allot_ingest_shard_up is as fresh as the scrape (the pings' answers are
// kept for a second).
type probedGauge struct {
	*prometheus.GaugeVec
	probe func(ctx context.Context) // nil: none yet
}

func (g *probedGauge) Collect(ch chan<- prometheus.Metric) {
	if g.probe != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		g.probe(ctx)
		cancel()
	}
	g.GaugeVec.Collect(ch)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	r := registrar{reg: reg}
	m := &metrics{}
	m.publish.Settle.Active = register(&r, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "allot_ingest_settle_active",
		Help: "Request ids whose PubAck was lost that this instance is republishing or voiding.",
	}))
	m.publish.Settle.Copies = register(&r, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allot_ingest_settle_republished_total",
		Help: "Copies of requests whose PubAck was lost published again in the background (same Nats-Msg-Id).",
	}))
	m.publish.Settle.Confirmed = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_ingest_settle_confirmed_total",
		Help: "Requests whose PubAck was lost that a background copy confirmed stored, by how (stored, duplicate).",
	}, []string{"how"}))
	m.publish.Settle.Voids = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_ingest_voids_total",
		Help: "Voids published for request ids that may never have been stored, by who asked (issuer, poll, overflow).",
	}, []string{"by"}))
	m.publish.Settle.Stored = register(&r, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allot_ingest_voids_confirmed_total",
		Help: "Voids the broker confirmed (stored, or dropped as a duplicate of the original or an earlier void).",
	}))
	m.requests = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_ingest_http_requests_total",
		Help: "HTTP requests answered, by route pattern and status code.",
	}, []string{"route", "code"}))
	m.publish.PublishDuration = register(&r, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "allot_ingest_publish_duration_seconds",
		Help:    "Time from publishing a request to its JetStream PubAck (or failure).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5ms .. 4s
	}))
	m.publish.PublishFailures = register(&r, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allot_ingest_publish_failures_total",
		Help: "Requests that JetStream did not store (answered 503).",
	}))
	m.replays = register(&r, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allot_ingest_idempotent_replays_total",
		Help: "Writes answered with the request id of an earlier use of their Idempotency-Key.",
	}))
	m.results.Waiters = register(&r, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "allot_ingest_waiters",
		Help: "HTTP handlers waiting for a request's result (?wait=).",
	}))
	m.shed.Claims = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_ingest_shed_claims_total",
		Help: "Claims for a full activity answered before the allocator applied them, by outcome.",
	}, []string{"outcome"}))
	m.publish.CommitBatch = register(&r, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "allot_ingest_commit_batch_size",
		Help:    "Messages (single requests and batches) published together as one atomic batch (group commit).",
		Buckets: prometheus.ExponentialBuckets(16, 2, 7),
	}))
	m.publish.MessageRequests = register(&r, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "allot_ingest_message_requests",
		Help:    "Requests in each message the group commit published: 1 for a single request, more for a batch of one activity's requests.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 11), // 1 .. 1024
	}))
	m.shed.TailWait = register(&r, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "allot_ingest_tail_wait_seconds",
		Help:    "Time from a claim's PubAck until this ingest's tail of the request stream passed it (shedding).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
	}))
	m.results.Queries = register(&r, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allot_ingest_result_queries_total",
		Help: "MySQL queries that read results for polls and waiting handlers (each gathers up to 500 reads).",
	}))
	m.results.Refused = register(&r, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allot_ingest_waiters_refused_total",
		Help: "Writes and polls with ?wait= answered at once, without waiting, because ALLOT_INGEST_MAX_WAITERS handlers were already waiting.",
	}))
	m.shed.Missed = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_ingest_shed_missed_total",
		Help: "Claims for an activity with a view that were left to the allocator: the stream held a change after the view (changed), or the tail did not pass the claim in time (tail_behind).",
	}, []string{"reason"}))
	m.access.AuthFailures = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_ingest_auth_failures_total",
		Help: "Requests refused before their handler: no token (missing), a token that failed verification (invalid), or too many such from one address (flood).",
	}, []string{"reason"}))
	m.access.ReadsLimited = register(&r, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allot_ingest_reads_limited_total",
		Help: "Activity and signup reads answered 429 because their caller was over ALLOT_INGEST_READ_RATE.",
	}))
	m.shardUp = register(&r, &probedGauge{GaugeVec: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "allot_ingest_shard_up",
		Help: "Whether the MySQL shard answers a ping (1) or not (0), by shard (ALLOT_MYSQL_SHARDS; default without it).",
	}, []string{"shard"})})
	m.reads.Up = m.shardUp.GaugeVec
	m.reads.Errors = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_ingest_shard_read_errors_total",
		Help: "Reads of activities, signups and results that failed on a MySQL shard (it did not answer in time, or erred), by shard.",
	}, []string{"shard"}))
	if r.err != nil {
		return nil, r.err
	}
	return m, nil
}

// registrar registers each metric where newMetrics builds it, so that a
// metric is declared in one place. After the first failure it registers
// nothing more and keeps that error.
type registrar struct {
	reg prometheus.Registerer
	err error
}

// register registers c with r's registry unless an earlier one failed, and
// returns c.
func register[C prometheus.Collector](r *registrar, c C) C {
	if r.err == nil {
		if err := r.reg.Register(c); err != nil {
			r.err = fmt.Errorf("ingest: register metrics: %w", err)
		}
	}
	return c
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
