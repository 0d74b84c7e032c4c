//go:build race

package faults

// raceEnabled: the tests run with the race detector, so the binaries the
// scenarios run are built with it too.
const raceEnabled = true
