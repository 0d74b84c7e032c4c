package allocator

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/allot-dev/allot/internal/store"
)

type metrics struct {
	decisions       *prometheus.CounterVec
	batchSize       prometheus.Histogram
	txSeconds       prometheus.Histogram
	txRetries       prometheus.Counter
	rejected        prometheus.Counter
	gapFilled       prometheus.Counter
	viewRebuilds    prometheus.Counter
	viewRebuildSecs prometheus.Histogram
	viewsPending    prometheus.Gauge
	viewsDropped    *prometheus.CounterVec
	cacheHits       prometheus.Counter
	cacheLoads      prometheus.Counter
	eventsPublished prometheus.Counter
	holdsScheduled  prometheus.Counter
	badEntries      prometheus.Counter
	acceptToApply   prometheus.Histogram
	pending         prometheus.Gauge
	backlog         prometheus.Gauge
	stalled         prometheus.Gauge
	giveUps         prometheus.Counter
}

// newMetrics builds the metrics, each registered with reg where it is
// built (promauto: a failed registration panics, as MustRegister does).
func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		decisions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_allocator_decisions_total", Help: "Requests applied, by op and outcome.",
		}, []string{"op", "outcome"}),
		batchSize: f.NewHistogram(prometheus.HistogramOpts{
			Name: "allot_allocator_batch_size", Help: "Requests applied per transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		txSeconds: f.NewHistogram(prometheus.HistogramOpts{
			Name: "allot_allocator_transaction_duration_seconds", Help: "Time to apply and commit one batch.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		txRetries: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_transaction_retries_total", Help: "Transactions run again after a deadlock, lock wait timeout or lost connection.",
		}),
		rejected: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_rejected_messages_total", Help: "Malformed messages terminated and recorded.",
		}),
		viewRebuilds: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_view_rebuilds_total",
			Help: "Rebuilds of this partition's views from MySQL: at start and whenever the allocator takes the partition.",
		}),
		viewRebuildSecs: f.NewHistogram(prometheus.HistogramOpts{
			Name: "allot_allocator_view_rebuild_duration_seconds", Help: "Time to rebuild this partition's views (read the bucket, one MySQL snapshot, queue the views).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		viewsPending: f.NewGauge(prometheus.GaugeOpts{
			Name: "allot_allocator_views_pending", Help: "Activities whose latest view waits to be written to the view bucket (off the apply loop).",
		}),
		viewsDropped: f.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_allocator_views_dropped_total",
			Help: "Views not written to the bucket: queue_full (the queue was at its bound), stale (the bucket or MySQL holds a later state), failed (refused by the server), handover (the partition went to another allocator).",
		}, []string{"reason"}),
		gapFilled: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_gap_filled_messages_total", Help: "Messages read from the stream to fill a gap left by a dead allocator.",
		}),
		cacheHits: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_cache_hits_total", Help: "Batches that used an activity's cached state.",
		}),
		cacheLoads: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_cache_loads_total", Help: "Activity states loaded from MySQL.",
		}),
		eventsPublished: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_events_published_total", Help: "Outbox events relayed to ALLOT_EVENTS.",
		}),
		holdsScheduled: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_holds_scheduled_total", Help: "Hold expiries scheduled in ALLOT_HOLDS by the outbox relay.",
		}),
		badEntries: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_outbox_bad_entries_total",
			Help: "Outbox entries the relay could not read and skipped (recorded in outbox_skipped).",
		}),
		acceptToApply: f.NewHistogram(prometheus.HistogramOpts{
			Name: "allot_allocator_accept_to_apply_seconds", Help: "Time from ingest receiving a request to its commit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		pending: f.NewGauge(prometheus.GaugeOpts{
			Name: "allot_allocator_consumer_pending_messages", Help: "Requests stored on this partition and not yet acknowledged (the allocator's lag).",
		}),
		stalled: f.NewGauge(prometheus.GaugeOpts{
			Name: "allot_allocator_partition_stalled",
			Help: "1 while this allocator has given its partition up because it could not commit while requests waited (ALLOT_STALL_TIMEOUT), until a transaction commits again.",
		}),
		giveUps: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_stall_giveups_total",
			Help: "Times this allocator gave its partition up to a peer because it could not commit for ALLOT_STALL_TIMEOUT while requests waited.",
		}),
		backlog: f.NewGauge(prometheus.GaugeOpts{
			Name: "allot_allocator_outbox_backlog_requests", Help: "Applied requests whose events are not yet relayed to ALLOT_EVENTS.",
		}),
	}
}

// watch refreshes the gauges that need a question to the broker or the
// database, every period until ctx ends.
func (a *Allocator) watch(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if info, err := a.cons.Info(ctx); err == nil {
			a.m.pending.Set(float64(info.NumPending + uint64(info.NumAckPending)))
		}
		if n, err := store.OutboxBacklog(ctx, a.db, a.cfg.Partition); err == nil {
			a.m.backlog.Set(float64(n))
		}
	}
}
