// Package testenv decides what a test does when a dependency of its own is
// missing (Redis, a database server it runs itself, a browser): on a
// developer's machine it skips and says how to get it; on CI (CI=true) it
// fails, so that the suite CI runs is the whole suite and nothing passes by
// being skipped.
package testenv

import (
	"net"
	"os"
	"strconv"
	"testing"
	"time"
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

// WaitFor waits until cond holds, checking every 10ms, and fails t when it
// does not within timeout. It is the tests' one way to wait for a
// condition instead of sleeping for a guessed time or asserting how long
// something took. Call it from the test's goroutine only (it may call
// t.Fatalf).
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// DeadDSN is a MySQL DSN (database db) naming a local port where nothing
// listens: a database that is down.
func DeadDSN(t testing.TB, db string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return "root@tcp(127.0.0.1:" + strconv.Itoa(port) + ")/" + db + "?parseTime=true"
}
