// Package testenv decides what a test does when a dependency of its own is
// missing (Redis, a database server it runs itself, a browser): on a
// developer's machine it skips and says how to get it; on CI (CI=true) it
// fails, so that the suite CI runs is the whole suite and nothing passes by
// being skipped.
package testenv

import (
	"os"
	"testing"
)

// OnCI reports whether the tests run on CI: CI is set to true (or 1), as
// CI's runner sets it for .ci/run.
func OnCI() bool {
	v := os.Getenv("CI")
	return v == "true" || v == "1"
}

// Missing skips t, saying why, or fails it on CI.
func Missing(t testing.TB, why string) {
	t.Helper()
	if OnCI() {
		t.Fatalf("%s (on CI a missing dependency fails the test rather than skip it)", why)
	}
	t.Skip(why)
}
