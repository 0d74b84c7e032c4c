package main

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestDiskProbeWritesBesideARunAndCleansUp: the probe writes while the
// run goes on, at most once an interval, and leaves no file behind; the
// run's error is returned as it is.
func TestDiskProbeWritesBesideARunAndCleansUp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	boom := errors.New("the run failed")
	const every = 2 * time.Millisecond
	start := time.Now()
	s, err := diskProbed(dir, every, func() error {
		time.Sleep(300 * time.Millisecond)
		return boom
	})
	took := time.Since(start)
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want the run's", err)
	}
	// One write at the start and at most one a tick until the probe saw
	// the stop; a slow disk only makes fewer.
	if most := int(took/every) + 1; s.n < 5 || s.n > most {
		t.Fatalf("%d writes in %s at one each %s, want 5 to %d", s.n, took, every, most)
	}
	if s.max <= 0 || s.p50 > s.p99 || s.p99 > s.max {
		t.Fatalf("figures out of order: p50 %s, p99 %s, max %s", s.p50, s.p99, s.max)
	}
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("the probe left %d file(s) behind, e.g. %s", len(left), left[0].Name())
	}
}

// TestDiskProbeOffRunsAlone: interval 0 runs the function without a probe.
func TestDiskProbeOffRunsAlone(t *testing.T) {
	t.Parallel()
	ran := false
	s, err := diskProbed(t.TempDir(), 0, func() error { ran = true; return nil })
	if err != nil || !ran || s.n != 0 {
		t.Fatalf("ran %v, err %v, %d writes; want a run and no probe", ran, err, s.n)
	}
	if got := longestWrite(s); got != "-" {
		t.Fatalf("table cell %q without a probe, want -", got)
	}
}

// TestDiskStatsFindTheStall: the longest write and when it started, the
// writes over the stall threshold, and the line that places the stall
// from the run's first claim.
func TestDiskStatsFindTheStall(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	var ws []diskWrite
	for i := range 100 {
		ws = append(ws, diskWrite{at: t0.Add(time.Duration(i) * 10 * time.Millisecond), took: 500 * time.Microsecond})
	}
	ws[40].took = 180 * time.Millisecond
	ws[70].took = 25 * time.Millisecond
	s := diskStatsOf(ws)
	if s.n != 100 || s.max != 180*time.Millisecond || !s.maxAt.Equal(ws[40].at) || s.slow != 2 {
		t.Fatalf("got %d writes, longest %s at %s, %d slow; want 100, 180ms at %s, 2", s.n, s.max, s.maxAt, s.slow, ws[40].at)
	}
	if s.p50 != 500*time.Microsecond {
		t.Fatalf("p50 %s, want 500µs", s.p50)
	}
	line := s.describe(10*time.Millisecond, t0.Add(100*time.Millisecond))
	if !strings.Contains(line, "the longest 180ms, started 300ms after the first claim; 2 over 20ms") {
		t.Fatalf("line %q does not place the stall", line)
	}
	if line := s.describe(10*time.Millisecond, t0.Add(time.Second)); !strings.Contains(line, "started before the first claim") {
		t.Fatalf("line %q: a stall before the first claim is not placed after it", line)
	}
	if got := diskStatsOf(nil); got.n != 0 || got.describe(time.Millisecond, t0) != "no disk probe" {
		t.Fatalf("no writes: %+v", got)
	}
}
