package allocator

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// TestMetricsFollowPrometheusConventions lints every allocator metric with
// promtool's rules (names, units, _total on counters, help text).
func TestMetricsFollowPrometheusConventions(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"partition": "0"}, reg))
	// A vector shows up only once it has a child.
	m.decisions.WithLabelValues("join", "CONFIRMED").Inc()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) < 10 {
		t.Fatalf("gathered %d metric families, want every allocator metric", len(families))
	}
	problems, err := promlint.NewWithMetricFamilies(families).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}
