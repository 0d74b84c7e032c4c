// Package follow keeps one partition's allocator on the route the shard
// map names, in a running process: when the map moves the partition (to
// another shard, or to another epoch), it stops the allocator on the old
// route (its batch in hand, its relay's last pass) and starts one on the
// new route; when the partition is frozen (its fence row at no epoch: a
// move under way), only this partition waits, until the map moves it or
// its fence is at the map's epoch again (a move undone). The other
// partitions are not touched.
package follow

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocator/shardup"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
)

// Runner is a started allocator of one partition on one route.
type Runner interface {
	// Stop finishes the batch in hand and returns once it has stopped.
	Stop()
	// Wait returns once it has stopped, with why (nil after Stop).
	Wait() error
}

// StartFunc builds and starts the partition's allocator on rt, its
// metrics registered with reg (released once it has stopped).
type StartFunc func(ctx context.Context, rt shards.Route, reg prometheus.Registerer) (Runner, error)

// Partition follows one partition's route.
type Partition struct {
	P      int
	Router *shards.Router
	Start  StartFunc
	// Registerer takes each allocator's metrics; each one's are
	// unregistered once it has stopped, so the next one registers anew.
	Registerer prometheus.Registerer
	Log        *slog.Logger
	// Poll is how often a frozen partition's fence row is read (0: 500ms).
	Poll time.Duration
	// Restarted, when set, runs after an allocator was started on a new
	// route (or the same one, thawed), or after Launch waited.
	Restarted func(rt shards.Route)
	// Waiting, when set, runs when Launch starts to wait for the
	// partition's shard (once per wait, not per try).
	Waiting func()

	first Runner // Launch's
	route shards.Route
}

// Ready is when a shard may be used: its channel is closed once the shard
// is migrated (shardup.Shards.Ready).
type Ready func(shard string) <-chan struct{}

// Launch starts the partition's first allocator on the route the map
// names; Run follows it from there. With ready nil (one shard) a start
// that fails is returned, as is a route the map does not give. With ready,
// the partition first waits for its shard to be ready, and a start that
// fails while its shard does not answer is tried again with backoff (one
// log line when it fails, one when it starts): a shard that is down stops
// only its partitions, also at start. waiting (and Waiting, once) runs
// when the partition waits for its shard. Launch returns nil without an
// allocator when ctx ends first.
func (f *Partition) Launch(ctx context.Context, ready Ready, waiting func()) error {
	backoff, failed, waited := f.poll(), false, false
	wait := func() {
		if waiting != nil {
			waiting()
		}
		if !waited && f.Waiting != nil {
			f.Waiting()
		}
		waited = true
	}
	for {
		rt, err := f.Router.Route(f.P)
		if err != nil {
			return err
		}
		if ready != nil {
			if ch := ready(rt.Shard); !closed(ch) {
				wait()
				select {
				case <-ctx.Done():
					return nil
				case <-ch:
				case <-f.Router.Changed(): // routed elsewhere, maybe
				}
				continue
			}
		}
		r, err := f.startOn(ctx, rt)
		if err == nil {
			if failed {
				f.Log.InfoContext(ctx, "partition started: its shard answers again", slog.Int("partition", f.P),
					slog.String("shard", rt.Shard), slog.Uint64("epoch", rt.Epoch))
			}
			if waited && f.Restarted != nil {
				f.Restarted(rt)
			}
			f.first, f.route = r, rt
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		if ready == nil || shardup.Answers(ctx, rt.DB) {
			return err
		}
		if !failed {
			failed = true
			f.Log.WarnContext(ctx, "partition could not start: its shard does not answer; trying again", slog.Int("partition", f.P),
				slog.String("shard", rt.Shard), slog.Any("err", err))
		}
		wait()
		select {
		case <-ctx.Done():
			return nil
		case <-f.Router.Changed():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, shardup.Backoff.Max)
	}
}

// closed reports whether ch is closed (a nil ch is not).
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Run follows the partition from the allocator Launch started until ctx
// ends (it stops the allocator then and returns nil) or an allocator stops
// for another reason than its fence (its error, nil when it stopped
// cleanly by itself). An allocator that finds its fence row at another
// epoch than the map's (store.ErrEpoch) stops at once, its batch
// unapplied; the partition then waits here, not given up as stalled:
// nothing is wrong with its shard, it is being moved.
func (f *Partition) Run(ctx context.Context) error {
	cur, rt := f.first, f.route
	for {
		next, err := f.follow(ctx, cur, rt)
		if err != nil || ctx.Err() != nil {
			return err
		}
		if cur, rt = f.restart(ctx, next); cur == nil {
			return nil // ctx ended
		}
	}
}

// follow watches cur until it must be replaced: it returns the route to
// start on, or an error to stop with (none when ctx ended).
func (f *Partition) follow(ctx context.Context, cur Runner, rt shards.Route) (shards.Route, error) {
	done := make(chan error, 1)
	go func() { done <- cur.Wait() }()
	for {
		changed := f.Router.Changed()
		if now, moved := f.moved(rt); moved {
			f.Log.InfoContext(ctx, "the shard map moved the partition: stopping it on its old route",
				slog.Int("partition", f.P), slog.String("from", rt.Shard), slog.Uint64("from_epoch", rt.Epoch),
				slog.String("to", now.Shard), slog.Uint64("to_epoch", now.Epoch))
			cur.Stop()
			<-done
			return now, nil
		}
		select {
		case <-ctx.Done():
			cur.Stop()
			<-done
			return shards.Route{}, nil
		case err := <-done:
			if !errors.Is(err, store.ErrEpoch) {
				return shards.Route{}, err
			}
			f.Log.InfoContext(ctx, "partition fenced (frozen by a move, or moved): waiting for the shard map or its fence",
				slog.Int("partition", f.P), slog.String("shard", rt.Shard), slog.Uint64("epoch", rt.Epoch), slog.Any("err", err))
			return f.waitFenced(ctx, rt)
		case <-changed:
		}
	}
}

// moved is the partition's route now and whether it differs from rt
// (a map without an entry for it, or naming a shard not configured, is
// no route to go to: it is not moved).
func (f *Partition) moved(rt shards.Route) (shards.Route, bool) {
	now, err := f.Router.Route(f.P)
	if err != nil {
		return rt, false
	}
	return now, now.Shard != rt.Shard || now.Epoch != rt.Epoch
}

// waitFenced waits until the map moves the partition, or its fence row on
// rt's shard is at rt's epoch again, and returns the route to start on.
func (f *Partition) waitFenced(ctx context.Context, rt shards.Route) (shards.Route, error) {
	t := time.NewTicker(f.poll())
	defer t.Stop()
	for {
		changed := f.Router.Changed()
		if now, moved := f.moved(rt); moved {
			return now, nil
		}
		if at, err := store.PartitionEpoch(ctx, rt.DB, f.P); err == nil && at == rt.Epoch {
			f.Log.InfoContext(ctx, "partition's fence is at the map's epoch again: applying it", slog.Int("partition", f.P),
				slog.String("shard", rt.Shard), slog.Uint64("epoch", rt.Epoch))
			return rt, nil
		}
		select {
		case <-ctx.Done():
			return shards.Route{}, nil
		case <-changed:
		case <-t.C:
		}
	}
}

// restart starts the partition on rt, trying again (on the route the map
// names then) until it starts or ctx ends (nil).
func (f *Partition) restart(ctx context.Context, rt shards.Route) (Runner, shards.Route) {
	backoff := f.poll()
	for {
		r, err := f.startOn(ctx, rt)
		if err == nil {
			f.Log.InfoContext(ctx, "partition started on its route", slog.Int("partition", f.P),
				slog.String("shard", rt.Shard), slog.Uint64("epoch", rt.Epoch))
			if f.Restarted != nil {
				f.Restarted(rt)
			}
			return r, rt
		}
		if ctx.Err() != nil {
			return nil, rt
		}
		f.Log.ErrorContext(ctx, "partition could not start on its route; trying again", slog.Int("partition", f.P),
			slog.String("shard", rt.Shard), slog.Uint64("epoch", rt.Epoch), slog.Any("err", err), slog.Duration("backoff", backoff))
		select {
		case <-ctx.Done():
			return nil, rt
		case <-f.Router.Changed():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
		if now, moved := f.moved(rt); moved {
			rt = now
		}
	}
}

// startOn starts an allocator on rt with metrics of its own.
func (f *Partition) startOn(ctx context.Context, rt shards.Route) (Runner, error) {
	sc := &scope{Registerer: f.Registerer}
	if sc.Registerer == nil {
		sc.Registerer = prometheus.NewRegistry()
	}
	r, err := f.Start(ctx, rt, sc)
	if err != nil {
		sc.release()
		return nil, err
	}
	return &scoped{Runner: r, sc: sc}, nil
}

func (f *Partition) poll() time.Duration {
	if f.Poll > 0 {
		return f.Poll
	}
	return 500 * time.Millisecond
}

// scoped is a Runner whose metrics are unregistered once it has stopped.
type scoped struct {
	Runner
	sc   *scope
	once sync.Once
}

func (s *scoped) Wait() error {
	err := s.Runner.Wait()
	s.once.Do(s.sc.release)
	return err
}

func (s *scoped) Stop() {
	s.Runner.Stop()
	s.once.Do(s.sc.release)
}

// scope registers with Registerer and remembers what, so that release
// unregisters it all: the next allocator of the partition registers the
// same metrics.
type scope struct {
	prometheus.Registerer
	mu  sync.Mutex
	cs  []prometheus.Collector
	off bool
}

func (s *scope) Register(c prometheus.Collector) error {
	if err := s.Registerer.Register(c); err != nil {
		return err
	}
	s.mu.Lock()
	s.cs = append(s.cs, c)
	s.mu.Unlock()
	return nil
}

func (s *scope) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := s.Register(c); err != nil {
			panic(err)
		}
	}
}

func (s *scope) Unregister(c prometheus.Collector) bool {
	return s.Registerer.Unregister(c)
}

func (s *scope) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off {
		return
	}
	s.off = true
	for _, c := range s.cs {
		s.Registerer.Unregister(c)
	}
}
