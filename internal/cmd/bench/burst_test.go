package main

import (
	"bytes"
	"math"
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
	}, allotName, gateName, lastResult)
	if want := []float64{0.75, 1.5}; !slices.Equal(got, want) {
		t.Fatalf("ratios %v, want %v", got, want)
	}
}

// TestBurstCPUCountsEveryPart: the CPU ratio compares each burst's server,
// load tool, MariaDB and Redis together, so a design that moves its work
// from its server into Redis (the gate) is charged for it; a round whose
// CPU was not measured ends the list rather than dividing by zero.
func TestBurstCPUCountsEveryPart(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	b := func(round int, name string, cpu cpuSample) burst { return burst{round: round, name: name, cpu: cpu} }
	got := burstRatios([]burst{
		b(1, allotName, cpuSample{server: ms(1000), self: ms(900), mariadb: ms(300)}),
		b(1, gateName, cpuSample{server: ms(1200), self: ms(1000), mariadb: ms(100), redis: ms(700)}),
		b(2, allotName, cpuSample{server: ms(1500)}),
		b(2, gateName, cpuSample{}),
	}, allotName, gateName, burstCPU)
	want := []float64{(1.0 + 0.9 + 0.3) / (1.2 + 1.0 + 0.1 + 0.7)}
	if len(got) != len(want) || math.Abs(got[0]-want[0]) > 1e-9 {
		t.Fatalf("CPU ratios %v, want %v", got, want)
	}
}

// TestPrintRatiosNamesTheMeasure: a ratio line says what it compares and
// gives the median; a list with no rounds prints nothing rather than
// failing on its median.
func TestPrintRatiosNamesTheMeasure(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	printRatios(&out, "allot / gated seed", cpuOfBurst, []float64{0.9, 0.7, 0.8}, "a reading")
	want := "ratio allot / gated seed, CPU of the burst (server, load tool, MariaDB, Redis), round by round: 0.90, 0.70, 0.80; median 0.80 (a reading)\n"
	if got := out.String(); got != want {
		t.Fatalf("printed %q, want %q", got, want)
	}
	out.Reset()
	printRatios(&out, "allot / gated seed", cpuOfBurst, nil, "a reading")
	if out.Len() != 0 {
		t.Fatalf("no rounds printed %q, want nothing", out.String())
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
