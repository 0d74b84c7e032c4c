package follow

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/allot-dev/allot/internal/shards"
)

// Partitions are n partitions 0..n-1 like proto, each with restarted as
// its Restarted and waiting as its Waiting (either may be nil).
func Partitions(n int, proto Partition, restarted, waiting func(p int)) []*Partition {
	out := make([]*Partition, n)
	for p := range out {
		f := proto
		f.P = p
		if restarted != nil {
			f.Restarted = func(shards.Route) { restarted(p) }
		}
		if waiting != nil {
			f.Waiting = func() { waiting(p) }
		}
		out[p] = &f
	}
	return out
}

// All launches every partition of parts at once, each on its own (Launch:
// one whose shard is slow or down does not hold up the others' start),
// and follows each (Run) until ctx ends or one stops, then stops them all
// at once and returns why (nil when ctx ended). The first error of a
// Launch, or the first Run that returns, is why. settled, when set, runs
// once, when every partition has started or waits for its shard (the
// partitions waiting then, by number).
//
// All at once: each allocator's Stop may take its shutdown grace (the
// batch in hand, the relay's last pass); one after another, a process with
// several partitions would need a multiple of it and be killed half way.
func All(ctx context.Context, parts []*Partition, ready Ready, settled func(started int, waiting []int)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu      sync.Mutex
		left    = len(parts)
		waiting []int
		once    = make([]sync.Once, len(parts))
	)
	settle := func(i int, started bool) {
		once[i].Do(func() {
			mu.Lock()
			if !started {
				waiting = append(waiting, parts[i].P)
			}
			left--
			done := left == 0
			if done {
				slices.Sort(waiting)
			}
			mu.Unlock()
			if done && settled != nil {
				settled(len(parts)-len(waiting), waiting)
			}
		})
	}
	out := make(chan error, len(parts))
	var wg sync.WaitGroup
	for i, f := range parts {
		wg.Go(func() {
			if err := f.Launch(ctx, ready, func() { settle(i, false) }); err != nil {
				out <- err
				return
			}
			if ctx.Err() != nil {
				return // stopped before it started
			}
			settle(i, true)
			out <- f.Run(ctx)
		})
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-out:
	}
	cancel() // each follower stops its allocator, all at once
	wg.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
