package lifecycle

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// blocker runs until ctx ends, and counts that it was stopped.
func blocker(stopped *atomic.Int32) Part {
	return Part{Name: "blocker", Run: func(ctx context.Context) error {
		<-ctx.Done()
		stopped.Add(1)
		return ctx.Err()
	}}
}

func TestRun(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name   string
		part   func(ctx context.Context) error
		cancel bool // end ctx from outside instead
		want   error
	}{
		{"ctx ends: every part stops, no error", nil, true, nil},
		{"a part fails: the others stop, its error wins", func(context.Context) error { return boom }, false, boom},
		{"a part ends on its own: a failure", func(context.Context) error { return nil }, false, ErrStopped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stopped atomic.Int32
			parts := []Part{blocker(&stopped), blocker(&stopped)}
			if tt.part != nil {
				parts = append(parts, Part{Name: "odd", Run: tt.part})
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel {
				time.AfterFunc(10*time.Millisecond, cancel)
			}
			err := Run(ctx, parts...)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Run = %v, want %v", err, tt.want)
			}
			if tt.want != nil && !strings.HasPrefix(err.Error(), "odd:") {
				t.Errorf("error %q does not name the part", err)
			}
			if stopped.Load() != 2 {
				t.Errorf("%d of 2 other parts stopped", stopped.Load())
			}
		})
	}
}

func TestHTTPServerDrainsThenStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var before atomic.Bool
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(http.StatusNoContent)
	})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, HTTPServer("http", srv, ln, 5*time.Second, func() { before.Store(true); close(release) }))
	}()
	answered := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	<-entered
	cancel()
	if code := <-answered; code != http.StatusNoContent {
		t.Errorf("the request in flight got %d, want 204: the shutdown did not drain it", code)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after a clean shutdown", err)
	}
	if !before.Load() {
		t.Error("beforeShutdown was not called")
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestStopAfter(t *testing.T) {
	boom := errors.New("boom")
	t.Run("stops only once done is closed", func(t *testing.T) {
		done := make(chan struct{})
		var order []string
		var mu sync.Mutex
		record := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
		var doneFirst bool // done was closed when metrics was told to stop
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		err := Run(ctx,
			Part{Name: "main", Run: func(ctx context.Context) error {
				defer close(done)
				<-ctx.Done()
				record("main")
				return nil
			}},
			StopAfter(done, Part{Name: "metrics", Run: func(ctx context.Context) error {
				<-ctx.Done()
				select {
				case <-done:
					doneFirst = true
				default:
				}
				record("metrics")
				return nil
			}}))
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		if !doneFirst {
			t.Error("metrics was told to stop before done was closed")
		}
		if len(order) != 2 || order[0] != "main" {
			t.Errorf("stopped in order %v, want main then metrics", order)
		}
	})
	t.Run("fails first: its error wins, the others stop", func(t *testing.T) {
		done := make(chan struct{})
		var stopped atomic.Int32
		main := blocker(&stopped)
		run := main.Run
		main.Run = func(ctx context.Context) error { defer close(done); return run(ctx) }
		err := Run(context.Background(), main,
			StopAfter(done, Part{Name: "metrics", Run: func(context.Context) error { return boom }}))
		if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "metrics:") {
			t.Fatalf("Run = %v, want metrics: boom", err)
		}
		if stopped.Load() != 1 {
			t.Error("the other part did not stop")
		}
	})
}
