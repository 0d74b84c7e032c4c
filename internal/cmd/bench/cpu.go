package main

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is CPU time (user+system) of the processes a burst runs on:
// the server under test, the load generator (this process) and the
// services it shares the machine with. Read from /proc, so on Linux only;
// elsewhere the figures are zero.
type cpuSample struct {
	self, mariadb, redis time.Duration
	// busy is the whole machine's CPU time not idle and not waiting for
	// I/O (every process and the kernel's own threads).
	busy time.Duration
	// at is when a sample was taken; wall, in a difference of two, the
	// time between them.
	at   time.Time
	wall time.Duration
}

func sampleCPU() cpuSample {
	return cpuSample{self: selfCPU(), mariadb: procCPU("mariadbd", "mysqld"), redis: procCPU("redis-server"),
		busy: machineBusy(), at: time.Now()}
}

// sub is the difference a - b of two samples, b taken first.
func (a cpuSample) sub(b cpuSample) cpuSample {
	return cpuSample{self: a.self - b.self, mariadb: a.mariadb - b.mariadb, redis: a.redis - b.redis,
		busy: a.busy - b.busy, wall: a.at.Sub(b.at)}
}

// coresBusy is, for a difference of samples, how many cores were busy on
// average over it.
func (a cpuSample) coresBusy() float64 {
	if a.wall <= 0 {
		return 0
	}
	return a.busy.Seconds() / a.wall.Seconds()
}

// machineBusy reads the first line of /proc/stat: every CPU's time in
// clock ticks, by kind; busy is all but idle and iowait.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU sums utime and stime of every process whose command is one of
// names (clock ticks of 10 ms, the kernel's USER_HZ on Linux).
func procCPU(names ...string) time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var total time.Duration
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		if !slices.Contains(names, s[open+1:closing]) {
			continue
		}
		f := strings.Fields(s[closing+1:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+st) * 10 * time.Millisecond
	}
	return total
}

// loadAverage is the machine's load average over 1, 5 and 15 minutes, as
// uptime prints it ("" when /proc/loadavg cannot be read).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "load average unknown"
	}
	return "load average " + strings.Join(f[:3], ", ")
}
