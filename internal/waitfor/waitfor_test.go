package waitfor

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWithin(t *testing.T) {
	var n atomic.Int32
	if !Within(time.Second, func() bool { return n.Add(1) >= 3 }) {
		t.Fatal("a condition that holds on the third poll timed out")
	}
	start := time.Now()
	if Within(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported true")
	}
	if el := time.Since(start); el < 50*time.Millisecond || el > time.Second {
		t.Errorf("gave up after %v, want about 50ms", el)
	}
}
