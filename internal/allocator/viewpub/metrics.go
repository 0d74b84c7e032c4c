package viewpub

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are a publisher's; NewMetrics registers them.
type Metrics struct {
	viewRebuilds    prometheus.Counter
	viewRebuildSecs prometheus.Histogram
	viewsPending    prometheus.Gauge
	viewsDropped    *prometheus.CounterVec
}

// NewMetrics builds the publisher's metrics, each registered with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
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
	}
}
