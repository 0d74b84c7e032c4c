package health

import (
	"database/sql"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/allot-dev/allot/internal/dbtest"
)

// TestShardUp: allot_allocator_shard_up is 1 for a shard that answers and
// 0 for one that does not, one series per shard, and follows promtool's
// rules.
func TestShardUp(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	away, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/allot?timeout=1s") // nothing listens on port 1
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { away.Close() })
	reg := prometheus.NewRegistry()
	reg.MustRegister(New(map[string]*sql.DB{"s0": db.DB, "s1": away}, nil).ShardUp())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(families).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	if len(families) != 1 || len(families[0].GetMetric()) != 2 {
		t.Fatalf("gathered %v, want allot_allocator_shard_up with two series", families)
	}
	for _, m := range families[0].GetMetric() {
		want := map[string]float64{"s0": 1, "s1": 0}[m.GetLabel()[0].GetValue()]
		if got := m.GetGauge().GetValue(); got != want {
			t.Errorf("allot_allocator_shard_up{shard=%q} = %v, want %v", m.GetLabel()[0].GetValue(), got, want)
		}
	}
	if n := testutil.CollectAndCount(reg, "allot_allocator_shard_up"); n != 2 {
		t.Errorf("a second scrape has %d series, want 2", n)
	}
}
