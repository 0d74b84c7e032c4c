package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/allot-dev/allot/internal/bench"
)

// The disk probe measures what every durable answer of allot waits for
// and the Redis gate's answers do not: a write at the end of a file,
// then an fsync. With fsync always, JetStream's file store appends each
// message to its block and syncs the block before the PubAck. An append
// changes the file's size, so the fsync waits for the file system's
// journal too, and a journal commit that stalls (on a shared virtual
// disk, for tens or hundreds of milliseconds now and then) stalls every
// publish behind it. The probe appends and syncs 4 KiB the same way at a
// steady pace, beside a run, so that a run's slowest answers can be set
// against the disk's slowest writes.

// diskBlock is the size at which the probe starts a new file, as the
// file store starts a new block.
const diskBlock = 8 << 20

// diskSlow is the write time above which a probe write counts as a stall.
const diskSlow = 20 * time.Millisecond

// diskWrite is one probe write: when it started and how long it took.
type diskWrite struct {
	at   time.Time
	took time.Duration
}

// diskProbe appends 4 KiB to a file in dir and syncs it, every interval
// until stopped.
type diskProbe struct {
	quit   chan struct{}
	done   chan struct{}
	writes []diskWrite
	err    error
}

// startDiskProbe starts a probe in dir (the file system the runs' stores
// are on), one write every interval.
func startDiskProbe(dir string, every time.Duration) *diskProbe {
	p := &diskProbe{quit: make(chan struct{}), done: make(chan struct{})}
	go p.run(dir, every)
	return p
}

func (p *diskProbe) run(dir string, every time.Duration) {
	defer close(p.done)
	var f *os.File
	var off int64
	defer func() {
		if f != nil {
			p.close(f)
		}
	}()
	buf := make([]byte, 4096)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if f == nil || off >= diskBlock {
			if f != nil {
				p.close(f)
			}
			var err error
			if f, err = os.CreateTemp(dir, "allot-bench-disk-*"); err != nil {
				p.err = fmt.Errorf("disk probe: %w", err)
				return
			}
			off = 0
		}
		start := time.Now()
		_, err := f.WriteAt(buf, off)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			p.err = fmt.Errorf("disk probe: %w", err)
			return
		}
		p.writes = append(p.writes, diskWrite{at: start, took: time.Since(start)})
		off += int64(len(buf))
		select {
		case <-p.quit:
			return
		case <-t.C:
		}
	}
}

// close closes and removes one of the probe's files.
func (p *diskProbe) close(f *os.File) {
	p.err = errors.Join(p.err, f.Close(), os.Remove(f.Name()))
}

// stop ends the probe, its files removed, and returns its writes.
func (p *diskProbe) stop() ([]diskWrite, error) {
	close(p.quit)
	<-p.done
	return p.writes, p.err
}

// diskStats sums up a probe's writes.
type diskStats struct {
	n             int
	p50, p99, max time.Duration
	// maxAt is when the longest write started; slow counts the writes
	// over diskSlow.
	maxAt time.Time
	slow  int
}

func diskStatsOf(ws []diskWrite) diskStats {
	if len(ws) == 0 {
		return diskStats{}
	}
	took := make([]time.Duration, len(ws))
	for i, w := range ws {
		took[i] = w.took
	}
	longest := slices.MaxFunc(ws, func(a, b diskWrite) int { return int(a.took - b.took) })
	s := diskStats{n: len(ws), p50: bench.Percentile(took, 0.50), p99: bench.Percentile(took, 0.99), max: longest.took, maxAt: longest.at}
	for _, w := range ws {
		if w.took > diskSlow {
			s.slow++
		}
	}
	return s
}

// diskProbed runs f with a probe beside it, one write every interval (0:
// no probe), and returns the probe's figures.
func diskProbed(dir string, every time.Duration, f func() error) (diskStats, error) {
	if every <= 0 {
		return diskStats{}, f()
	}
	p := startDiskProbe(dir, every)
	err := f()
	ws, perr := p.stop()
	if perr != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", perr)
	}
	return diskStatsOf(ws), err
}

// describe is one line on the probe's figures; first is the run's first
// claim, from which the longest write's start is given.
func (s diskStats) describe(every time.Duration, first time.Time) string {
	if s.n == 0 {
		return "no disk probe"
	}
	at := "before the first claim"
	if d := s.maxAt.Sub(first); d >= 0 {
		at = d.Round(time.Millisecond).String() + " after the first claim"
	}
	return fmt.Sprintf("the disk beside the run: %d appends of 4 KiB, each synced, one each %s (as the file store stores a message with fsync always), p50 %s, p99 %s; the longest %s, started %s; %d over %s",
		s.n, every, s.p50.Round(10*time.Microsecond), s.p99.Round(10*time.Microsecond), s.max.Round(100*time.Microsecond), at, s.slow, diskSlow)
}

// longestWrite is the probe's longest write for a table cell.
func longestWrite(s diskStats) string {
	if s.n == 0 {
		return "-"
	}
	return s.max.Round(100 * time.Microsecond).String()
}
