// Package lifecycle runs the long-lived parts of a process (a service's
// loop, an HTTP server) together with one rule, the errgroup's: the first
// part to fail or to stop on its own stops the others, and its error is
// the one returned. ingest, the allocator, the notifier and the make-run
// stack share it instead of a hand-written copy each.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
)

// ErrStopped is wrapped by the error of a part that returned nil while the
// others still ran: in a process whose parts belong together, one ending
// alone is a failure.
var ErrStopped = errors.New("stopped on its own")

// Part is one long-lived part of a process.
type Part struct {
	// Name prefixes the part's error; when empty, the part's errors are
	// returned as they are (they name the part already).
	Name string
	// Run runs until ctx ends (then returns nil, or ctx's error) or the
	// part fails.
	Run func(ctx context.Context) error
}

// Run runs parts until ctx ends or one of them returns, and waits for all
// of them. It returns nil when they all stopped because ctx ended, else the
// first error (a part's own, or ErrStopped for a part that returned nil
// early), prefixed with the part's name when it has one.
func Run(ctx context.Context, parts ...Part) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, p := range parts {
		g.Go(func() error {
			err := p.Run(gctx)
			switch {
			case gctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)):
				return nil // stopped because it was told to
			case err == nil:
				err = ErrStopped
			}
			if p.Name == "" {
				return err
			}
			return fmt.Errorf("%s: %w", p.Name, err)
		})
	}
	return g.Wait()
}

// HTTPServer is a Part that serves srv on ln until ctx ends, then calls
// beforeShutdown (if set: e.g. to answer long polls at once), shuts srv
// down gracefully within timeout, and closes it if that runs out. If
// serving fails first, it closes srv and returns that error.
func HTTPServer(name string, srv *http.Server, ln net.Listener, timeout time.Duration, beforeShutdown func()) Part {
	return Part{Name: name, Run: func(ctx context.Context) error {
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		select {
		case err := <-served:
			srv.Close() // the connections it has accepted go too
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
		}
		if beforeShutdown != nil {
			beforeShutdown()
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
			err = fmt.Errorf("graceful shutdown: %w", err)
			if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
				err = errors.Join(err, fmt.Errorf("serve: %w", serr))
			}
			return err
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	}}
}

// StopAfter returns p, told to stop once done is closed rather than when
// the others are: a metrics server that serves until the rest of the
// process has stopped, so that its last numbers can still be scraped. It
// still stops the others at once if it fails first. done must be closed
// when another part of the same Run returns (or later), so that Run's
// context ends too; StopAfter's part returns only then.
func StopAfter(done <-chan struct{}, p Part) Part {
	return Part{Name: p.Name, Run: func(ctx context.Context) error {
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-done:
				cancel()
			case <-stop:
			}
		}()
		err := p.Run(pctx)
		if pctx.Err() == nil {
			return err // failed on its own
		}
		<-ctx.Done() // the others are stopping, or have: Run's rule applies
		return err
	}}
}

// Chain returns parts, each after the first told to stop only once the
// one before it has returned (StopAfter): a pipeline whose later stages
// drain what the earlier ones leave.
func Chain(parts ...Part) []Part {
	out := make([]Part, len(parts))
	var prev chan struct{}
	for i, p := range parts {
		done := make(chan struct{})
		run := p.Run
		p.Run = func(ctx context.Context) error {
			defer close(done)
			return run(ctx)
		}
		if prev != nil {
			p = StopAfter(prev, p)
		}
		out[i], prev = p, done
	}
	return out
}
