package follow

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// TestScopeReleases: the metrics one allocator registered are gone once
// its scope is released, so the partition's next allocator registers the
// same ones; while they are registered, a second registration fails.
func TestScopeReleases(t *testing.T) {
	reg := prometheus.NewRegistry()
	labelled := func(r prometheus.Registerer) prometheus.Registerer {
		return prometheus.WrapRegistererWith(prometheus.Labels{"partition": "0"}, r)
	}
	first := &scope{Registerer: reg}
	c := promauto.With(labelled(first)).NewCounter(prometheus.CounterOpts{Name: "allot_test_total", Help: "A test counter."})
	c.Inc()
	second := &scope{Registerer: reg}
	if err := labelled(second).Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "allot_test_total", Help: "A test counter."})); err == nil {
		t.Fatal("the same counter registered twice while the first is in use")
	}
	first.release()
	first.release() // twice is harmless
	promauto.With(labelled(second)).NewCounter(prometheus.CounterOpts{Name: "allot_test_total", Help: "A test counter."})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetMetric()[0].GetCounter().GetValue() != 0 {
		t.Fatalf("after the release and a new registration: %v, want one counter at 0", mfs)
	}
}
