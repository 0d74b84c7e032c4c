package config

import (
	"runtime/debug"
	"testing"
)

// TestTuneGC: without GOGC the default percent is applied; with GOGC set
// (the runtime has applied it at start) the percent is left alone.
func TestTuneGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)

	if !TuneGC(func(string) string { return "" }) {
		t.Fatal("GOGC unset: TuneGC did not apply the default")
	}
	if p := debug.SetGCPercent(100); p != DefaultGCPercent {
		t.Fatalf("GOGC unset: percent %d, want %d", p, DefaultGCPercent)
	}
	debug.SetGCPercent(50) // as GOGC=50 would have set it at start
	if TuneGC(func(k string) string { return map[string]string{"GOGC": "50"}[k] }) {
		t.Fatal("GOGC=50: TuneGC applied the default over it")
	}
	if p := debug.SetGCPercent(100); p != 50 {
		t.Fatalf("GOGC=50: percent %d, want 50 left alone", p)
	}
}
