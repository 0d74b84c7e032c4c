package allocator

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/allot-dev/allot/internal/allocator/gauges"
	"github.com/allot-dev/allot/internal/allocator/viewpub"
)

type metrics struct {
	// views and gauges are the view publisher's and the gauges'.
	views         *viewpub.Metrics
	gauges        *gauges.Gauges
	decisions     *prometheus.CounterVec
	batchSize     prometheus.Histogram
	txSeconds     prometheus.Histogram
	txRetries     prometheus.Counter
	rejected      prometheus.Counter
	gapFilled     prometheus.Counter
	cache         cacheMetrics
	acceptToApply prometheus.Histogram
	stalled       prometheus.Gauge
	giveUps       prometheus.Counter
}

// cacheMetrics count the activity states found cached and loaded.
type cacheMetrics struct{ hits, loads prometheus.Counter }

// newMetrics builds the metrics, each registered with reg where it is
// built (promauto: a failed registration panics, as MustRegister does).
func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		views: viewpub.NewMetrics(reg), gauges: gauges.New(reg),
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
			Name: "allot_allocator_rejected_messages_total", Help: "Refused requests (and messages malformed as a whole) recorded as rejected.",
		}),
		gapFilled: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_gap_filled_messages_total", Help: "Messages read from the stream to fill a gap left by a dead allocator.",
		}),
		cache: cacheMetrics{
			hits: f.NewCounter(prometheus.CounterOpts{
				Name: "allot_allocator_cache_hits_total", Help: "Batches that used an activity's cached state.",
			}),
			loads: f.NewCounter(prometheus.CounterOpts{
				Name: "allot_allocator_cache_loads_total", Help: "Activity states loaded from MySQL.",
			}),
		},
		acceptToApply: f.NewHistogram(prometheus.HistogramOpts{
			Name: "allot_allocator_accept_to_apply_seconds", Help: "Time from ingest receiving a request to its commit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		stalled: f.NewGauge(prometheus.GaugeOpts{
			Name: "allot_allocator_partition_stalled",
			Help: "1 while this allocator has given its partition up because it could not commit while requests waited (ALLOT_STALL_TIMEOUT), until a transaction commits again.",
		}),
		giveUps: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_stall_giveups_total",
			Help: "Times this allocator gave its partition up to a peer because it could not commit for ALLOT_STALL_TIMEOUT while requests waited.",
		}),
	}
}
