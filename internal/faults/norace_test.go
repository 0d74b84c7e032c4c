//go:build !race

package faults

// raceEnabled: the tests run without the race detector.
const raceEnabled = false
