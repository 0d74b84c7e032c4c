package notifier

import "github.com/prometheus/client_golang/prometheus"

// Values of the result label of allot_notifier_deliveries_total.
const (
	resultDelivered    = "delivered"
	resultLogged       = "logged"
	resultDeadLettered = "dead_lettered"
)

type metrics struct {
	deliveries     *prometheus.CounterVec
	attempts       *prometheus.CounterVec
	attemptSeconds prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_notifier_deliveries_total",
			Help: "Events finished and acknowledged: delivered (2xx), logged (no webhook URL) or dead_lettered.",
		}, []string{"result"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_notifier_attempts_total",
			Help: "Webhook attempts by outcome: ok, 3xx, 4xx, 5xx, timeout or error.",
		}, []string{"outcome"}),
		attemptSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "allot_notifier_attempt_duration_seconds",
			Help:    "Time of one webhook attempt.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
	}
	for _, r := range []string{resultDelivered, resultLogged, resultDeadLettered} {
		m.deliveries.WithLabelValues(r)
	}
	reg.MustRegister(m.deliveries, m.attempts, m.attemptSeconds)
	return m
}
