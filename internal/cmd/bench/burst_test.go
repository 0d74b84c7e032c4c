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
	}, allotName, gateName)
	if want := []float64{0.75, 1.5}; !slices.Equal(got, want) {
		t.Fatalf("ratios %v, want %v", got, want)
	}
}

// TestRoundOrderRotates: each system goes first once every len rounds, and
// two systems alternate.
func TestRoundOrderRotates(t *testing.T) {
	t.Parallel()
	three := []string{"allot", "gate", "floor"}
	for r, want := range [][]string{{"allot", "gate", "floor"}, {"gate", "floor", "allot"}, {"floor", "allot", "gate"}, {"allot", "gate", "floor"}} {
		if got := roundOrder(three, r+1); !slices.Equal(got, want) {
			t.Errorf("round %d of three: %v, want %v", r+1, got, want)
		}
	}
	two := []string{"allot", "gate"}
	if got := roundOrder(two, 2); !slices.Equal(got, []string{"gate", "allot"}) {
		t.Errorf("round 2 of two: %v, want gate first", got)
	}
	if !slices.Equal(three, []string{"allot", "gate", "floor"}) {
		t.Errorf("roundOrder changed its argument: %v", three)
	}
}
