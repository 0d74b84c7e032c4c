package ingest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// TestMetricsFollowPrometheusConventions lints every ingest metric with
// promtool's rules (names, units, _total on counters, help text).
func TestMetricsFollowPrometheusConventions(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	// Vectors show up only once they have a child.
	m.requests.WithLabelValues("GET /healthz", "200").Inc()
	m.shed.Claims.WithLabelValues("SOLD_OUT").Inc()
	m.reads.Up.WithLabelValues("s0").Set(1)
	m.reads.Errors.WithLabelValues("s0").Inc()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) < 6 {
		t.Fatalf("gathered %d metric families, want every ingest metric", len(families))
	}
	problems, err := promlint.NewWithMetricFamilies(families).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}
