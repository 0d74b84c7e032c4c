package faults

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/testenv"
)

// TestAllThreadsStoppedReadsProc: a running process is not stopped; after
// SIGSTOP every thread of it is, and after SIGCONT again not.
func TestAllThreadsStoppedReadsProc(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // the test's own child
	pid := cmd.Process.Pid
	stopped := func() bool {
		t.Helper()
		ok, err := allThreadsStopped(pid)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if stopped() {
		t.Fatal("a sleeping process reads as stopped")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the process stopped", stopped)
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the process running again", func() bool { return !stopped() })
	if _, err := allThreadsStopped(1 << 30); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}
