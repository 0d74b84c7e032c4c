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
	self, server, mariadb, redis time.Duration
	// busy is the whole machine's CPU time not idle and not waiting for
	// I/O (every process and the kernel's own threads).
	busy time.Duration
	// at is when a sample was taken; wall, in a difference of two, the
	// time between them.
	at   time.Time
	wall time.Duration
}

// sampleCPU samples the processes, the server under test being process
// server (0: none).
func sampleCPU(server int) cpuSample {
	return cpuSample{self: selfCPU(), server: pidCPU(server), mariadb: procCPU("mariadbd", "mysqld"), redis: procCPU("redis-server"),
		busy: machineBusy(), at: time.Now()}
}

// sub is the difference a - b of two samples, b taken first.
func (a cpuSample) sub(b cpuSample) cpuSample {
	return cpuSample{self: a.self - b.self, server: a.server - b.server, mariadb: a.mariadb - b.mariadb, redis: a.redis - b.redis,
		busy: a.busy - b.busy, wall: a.at.Sub(b.at)}
}

// cpuWindow measures the CPU of the stretch a load tool marks with its
// Window hook (loadgen.Deps, bench.OpenLoopConfig): mark(true) samples as
// the first request goes out, mark(false) takes the difference once the
// last answer is in. The open before it and the reads after it are left
// out, and with them whatever a server does before it can apply the open
// (a fresh allot's migrations). got stays zero until both have run.
type cpuWindow struct {
	server int // the server under test's pid
	start  cpuSample
	got    cpuSample
}

func (w *cpuWindow) mark(start bool) {
	if start {
		w.start = sampleCPU(w.server)
		return
	}
	w.got = sampleCPU(w.server).sub(w.start)
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
// names.
func procCPU(names ...string) time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var total time.Duration
	for _, p := range stats {
		if command, cpu, ok := statCPU(p); ok && slices.Contains(names, command) {
			total += cpu
		}
	}
	return total
}

// pidCPU is utime and stime of process pid; 0 for pid 0 or a process
// that cannot be read.
func pidCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	_, cpu, _ := statCPU("/proc/" + strconv.Itoa(pid) + "/stat")
	return cpu
}

// statCPU reads a /proc/<pid>/stat file: the process's command and its
// utime plus stime (clock ticks of 10 ms, the kernel's USER_HZ on Linux).
func statCPU(path string) (command string, cpu time.Duration, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", 0, false
	}
	f := strings.Fields(s[closing+1:])
	if len(f) < 13 {
		return "", 0, false
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return s[open+1 : closing], time.Duration(u+st) * 10 * time.Millisecond, true
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
