package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// memory is `bench -memory`: ingest, the allocator and the NATS server run
// as separate processes, a long stream of requests (1,000,000 over 200,000
// activities by default) is sent through HTTP, and each process's resident
// memory is printed every tenth of the way and at its peak. Every bounded
// cache (ingest's views and tail, its shed answers, the allocator's
// activities and views) fills long before the end; from then on the
// figures must stay flat.
func memory(ctx context.Context, o opts) error {
	fmt.Fprintf(os.Stderr, "bench: memory: %d requests over %d activities, %d HTTP clients\n", o.memRequests, o.memActivities, o.httpConc)
	dsn, drop, err := freshDB(ctx, o.dsn, "allot_bench_mem_")
	if err != nil {
		return err
	}
	defer drop()
	dir, err := os.MkdirTemp("", "allot-bench-mem-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	np, _ := freePort()
	hp, _ := freePort()
	mp, _ := freePort()
	natsURL := "nats://127.0.0.1:" + strconv.Itoa(np)

	nats := exec.CommandContext(ctx, filepath.Join(o.bin, "natsd"), "-host", "127.0.0.1", "-port", strconv.Itoa(np), "-store", dir)
	natsLog, _ := os.CreateTemp("", "allot-bench-natsd-*.log")
	nats.Stdout, nats.Stderr = natsLog, natsLog
	if err := nats.Start(); err != nil {
		return fmt.Errorf("start natsd: %w (run make build first)", err)
	}
	defer func() { nats.Process.Kill(); nats.Wait() }() //nolint:errcheck
	if err := waitTCP(ctx, "127.0.0.1:"+strconv.Itoa(np)); err != nil {
		return fmt.Errorf("natsd: %w; its log: %s", err, natsLog.Name())
	}
	env := []string{"ALLOT_MYSQL_DSN=" + dsn, "ALLOT_NATS_URL=" + natsURL, "ALLOT_LOG_LEVEL=warn"}
	// The setup step first: the binaries only check the streams.
	setup := exec.CommandContext(ctx, filepath.Join(o.bin, "allotctl"), "setup")
	setup.Env = append(os.Environ(), env...)
	if out, err := setup.CombinedOutput(); err != nil {
		return fmt.Errorf("allotctl setup: %w (run make build first)\n%s", err, out)
	}
	alloc, err := start(ctx, filepath.Join(o.bin, "allocator"), nil,
		append(env, "ALLOT_METRICS_ADDR=127.0.0.1:"+strconv.Itoa(mp)), "http://127.0.0.1:"+strconv.Itoa(mp)+"/readyz")
	if err != nil {
		return err
	}
	defer alloc.stop()
	url := "http://127.0.0.1:" + strconv.Itoa(hp)
	ing, err := start(ctx, filepath.Join(o.bin, "ingest"), nil, append(env, "ALLOT_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(hp),
		"ALLOT_INGEST_OPEN_RATE=-1", "ALLOT_INGEST_USER_RATE=0"), url+"/readyz")
	if err != nil {
		return err
	}
	defer ing.stop()
	procs := []struct {
		name string
		pid  int
	}{{"ingest", ing.cmd.Process.Pid}, {"allocator", alloc.cmd.Process.Pid}, {"nats-server", nats.Process.Pid}}

	var sent, failed atomic.Int64
	jobs := make(chan int)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: o.httpConc}}
	var wg sync.WaitGroup
	for w := range o.httpConc {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range jobs {
				a := i%o.memActivities + 1
				var method, path, body string
				switch {
				case i < o.memActivities: // the first pass opens every activity
					method, path, body = "PUT", fmt.Sprintf("/v1/activities/%d", a), `{"capacity": 4}`
				case rng.IntN(4) == 0:
					method, path = "POST", fmt.Sprintf("/v1/activities/%d/claims/%d", a, 1+rng.IntN(50))
				case rng.IntN(3) == 0:
					method, path = "DELETE", fmt.Sprintf("/v1/activities/%d/signups/%d", a, 1+rng.IntN(50))
				default:
					method, path = "POST", fmt.Sprintf("/v1/activities/%d/signups/%d", a, 1+rng.IntN(50))
				}
				req, _ := http.NewRequestWithContext(ctx, method, url+path, strings.NewReader(body))
				resp, err := client.Do(req)
				if err != nil || resp.StatusCode != http.StatusAccepted {
					failed.Add(1)
				}
				if resp != nil {
					resp.Body.Close()
				}
				sent.Add(1)
			}
		})
	}
	fmt.Printf("\n== memory: %d requests over %d activities (resident set, MiB) ==\n", o.memRequests, o.memActivities)
	fmt.Printf("%10s %8s", "requests", "elapsed")
	for _, p := range procs {
		fmt.Printf(" %12s", p.name)
	}
	fmt.Println()
	begin := time.Now()
	row := func(label string, elapsed string, field string) {
		fmt.Printf("%10s %8s", label, elapsed)
		for _, p := range procs {
			fmt.Printf(" %12.0f", float64(procStatus(p.pid, field))/1024)
		}
		fmt.Println()
	}
	step := o.memRequests / 10
	for i := range o.memRequests {
		select {
		case jobs <- i:
		case <-ctx.Done():
			close(jobs)
			wg.Wait()
			return ctx.Err()
		}
		if (i+1)%step == 0 {
			row(strconv.Itoa(i+1), time.Since(begin).Round(time.Second).String(), "VmRSS")
		}
	}
	close(jobs)
	wg.Wait()
	row("peak", "", "VmHWM")
	fmt.Printf("%d requests in %s, %d not accepted\n", sent.Load(), time.Since(begin).Round(time.Second), failed.Load())
	return nil
}

// procStatus reads a kB figure (VmRSS, VmHWM) of a process from /proc.
func procStatus(pid int, field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// waitTCP waits until addr accepts connections.
func waitTCP(ctx context.Context, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s does not answer: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
