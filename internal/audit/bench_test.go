package audit_test

import (
	"testing"

	"github.com/allot-dev/allot/internal/audit"
)

// BenchmarkReplay100k audits 100,000 requests that a real allocator applied:
// reading the stream, replaying every decision and comparing every result
// and row. Setup (publishing and applying) is not timed.
func BenchmarkReplay100k(b *testing.B) {
	if testing.Short() {
		b.Skip("publishes and applies 100,000 requests")
	}
	e := newEnv(b)
	reqs := burst(100_000, 20, 200, 2000, 0x9E3779B97F4A7C15)
	seqs := e.publishAll(reqs)
	e.startAllocator()
	e.waitFence(seqs[len(seqs)-1])
	e.stopAllocator()

	b.ReportAllocs()
	var rep audit.Report
	n := 0
	for b.Loop() {
		rep = e.audit(audit.Config{})
		n++
	}
	if !rep.OK || rep.Replayed != len(reqs) || rep.Compared != len(reqs) {
		b.Fatalf("audit of clean traffic: replayed %d, compared %d, %d divergences:%s",
			rep.Replayed, rep.Compared, len(rep.Divergences), divergences(rep.Divergences[:min(5, len(rep.Divergences))]))
	}
	b.ReportMetric(float64(rep.Replayed*n)/b.Elapsed().Seconds(), "requests/s")
}
