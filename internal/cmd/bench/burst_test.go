package main

import (
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/loadgen"
)

// TestBurstRatiosPairRounds: each round's ratio is allot's time over the
// gate's of that round, whichever ran first; a round missing either
// system ends the list.
func TestBurstRatiosPairRounds(t *testing.T) {
	t.Parallel()
	b := func(round int, name string, d time.Duration) burst {
		return burst{round: round, name: name, rep: loadgen.Report{ToLastResult: d}}
	}
	got := burstRatios([]burst{
		b(1, allotName, 3*time.Second), b(1, gateName, 4*time.Second),
		b(2, gateName, 2*time.Second), b(2, allotName, 3*time.Second),
		b(3, allotName, time.Second),
	})
	if want := []float64{0.75, 1.5}; !slices.Equal(got, want) {
		t.Fatalf("ratios %v, want %v", got, want)
	}
}
