// Package waitfor is the tests' one way to wait for something to happen:
// poll a condition until it holds or a deadline passes, and fail the test
// saying what did not happen. Never a bare sleep.
package waitfor

import (
	"testing"
	"time"
)

// Interval is how often a condition is polled.
const Interval = 10 * time.Millisecond

// True polls cond every Interval until it holds, and fails t (Fatal) when
// timeout passes first, naming what was awaited.
func True(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("not within %s: %s", timeout, what)
	}
}

// Within polls cond every Interval until it holds (true) or timeout passes
// (false), for a test that handles the failure itself.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Interval)
	}
	return true
}
