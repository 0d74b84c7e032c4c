package testenv

import (
	"errors"
	"net"
	"sync/atomic"
)

// ErrListenerBroke is what a BrokenListener's Accept returns once broken.
var ErrListenerBroke = errors.New("listener broke")

// BrokenListener wraps a listener that a test can break: from Break on,
// Accept fails with ErrListenerBroke, as a listener whose socket went
// away would.
type BrokenListener struct {
	net.Listener
	broken atomic.Bool
}

// Accept accepts from the wrapped listener until Break.
func (l *BrokenListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && l.broken.Load() {
		return nil, ErrListenerBroke
	}
	return c, err
}

// Break makes Accept fail from now on.
func (l *BrokenListener) Break() {
	l.broken.Store(true)
	l.Listener.Close()
}
