package buildinfo

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestPrint(t *testing.T) {
	var b bytes.Buffer
	Print(&b, "ingest")
	line := b.String()
	if !strings.HasPrefix(line, "ingest ") || !strings.Contains(line, runtime.Version()) || strings.Count(line, "\n") != 1 {
		t.Errorf("-version line %q: want one line naming the binary and %s", line, runtime.Version())
	}
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != MetricName || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one %s series", mfs, MetricName)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || labels["goversion"] != runtime.Version() || labels["version"] == "" || labels["revision"] == "" {
		t.Errorf("%s = %v %v", MetricName, m.GetGauge().GetValue(), labels)
	}
}

func TestLinkTimeValuesWin(t *testing.T) {
	defer func(v, r string) { version, revision = v, r }(version, revision)
	version, revision = "v1.2.3", "abc123"
	if in := Read(); in.Version != "v1.2.3" || in.Revision != "abc123" {
		t.Errorf("Read = %+v, want the link-time version and revision", in)
	}
}
