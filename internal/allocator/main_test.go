package allocator

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/natstest"
)

// TestMain fails the package when a test leaves a goroutine running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, natstest.LeakOptions()...) }

// conf is the default configuration (the struct's tags) with set applied.
func conf(set func(*Config)) Config {
	c := config.Defaults[Config]()
	if set != nil {
		set(&c)
	}
	return c
}
