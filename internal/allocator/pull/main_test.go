package pull

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/allot-dev/allot/internal/natstest"
)

// TestMain fails the package when a test leaves a goroutine running: a
// feed's reader must end with it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, natstest.LeakOptions()...) }
