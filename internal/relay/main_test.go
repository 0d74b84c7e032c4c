package relay

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/allot-dev/allot/internal/natstest"
)

// TestMain fails the package when a test leaves a goroutine running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, natstest.LeakOptions()...) }
