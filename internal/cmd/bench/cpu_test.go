package main

import (
	"os"
	"testing"
	"time"
)

// TestCPUWindowMeasuresTheStretch: a window over a stretch of busy work
// counts this process's CPU both as the load tool (getrusage) and as a
// server named by its pid (/proc/<pid>/stat), and the stretch's wall
// time; a pid that does not exist counts nothing.
func TestCPUWindowMeasuresTheStretch(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc: the figures are zero off Linux")
	}
	w := cpuWindow{server: os.Getpid()}
	w.mark(true)
	// Spin until this process has used 200ms of CPU, however busy the
	// machine is (bounded, so that a broken getrusage cannot hang).
	from, deadline := selfCPU(), time.Now().Add(time.Minute)
	for selfCPU()-from < 200*time.Millisecond && time.Now().Before(deadline) {
	}
	w.mark(false)
	got := w.got
	if got.wall < 200*time.Millisecond {
		t.Errorf("wall %s, want at least the 200ms spun", got.wall)
	}
	// /proc counts clock ticks of 10 ms.
	if got.self < 200*time.Millisecond || got.server < 150*time.Millisecond {
		t.Errorf("self %s, server %s: want each about the 200ms spun", got.self, got.server)
	}
	if got.busy < got.server-20*time.Millisecond {
		t.Errorf("the machine busy %s, less than this process's %s", got.busy, got.server)
	}
	if d := pidCPU(0) + pidCPU(1<<30); d != 0 {
		t.Errorf("pid 0 and a pid that does not exist: %s, want 0", d)
	}
}
