package faults

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one binary the suite runs, possibly several times: each start is
// a new incarnation with the same arguments and environment, as a
// supervisor restarting it would do.
type proc struct {
	name string
	path string
	args []string
	env  []string

	mu   sync.Mutex
	runs []*incarnation
}

// incarnation is one run of a proc.
type incarnation struct {
	n      int
	cmd    *exec.Cmd
	output *tail // stdout and stderr
	done   chan struct{}
	err    error // what Wait returned, once done is closed
}

// newProc prepares binary to run with env (ALLOT_ variables; the test's
// own ALLOT_ variables are not inherited). At the end of t every
// incarnation still running is killed, and when t failed each one's output
// is written to the test log.
func newProc(t *testing.T, name, binary string, env []string, args ...string) *proc {
	path := binary
	if !filepath.IsAbs(binary) {
		path = filepath.Join(suite.bin, binary)
	}
	p := &proc{name: name, path: path, args: args, env: append(baseEnv(), env...)}
	t.Cleanup(func() {
		p.mu.Lock()
		runs := p.runs
		p.mu.Unlock()
		for _, r := range runs {
			if r.alive() {
				r.cmd.Process.Kill() //nolint:errcheck // it may have just exited
				<-r.done
			}
		}
		for _, r := range runs {
			if strings.Contains(r.output.String(), "WARNING: DATA RACE") {
				t.Errorf("%s#%d reported a data race (see its output below)", p.name, r.n)
			}
		}
		if t.Failed() || os.Getenv("ALLOT_FAULTS_LOGS") == "1" {
			for _, r := range runs {
				t.Logf("----- %s#%d (pid %d, %s) output, last %d bytes -----\n%s", p.name, r.n, r.cmd.Process.Pid,
					r.exitText(), r.output.cap, r.output.String())
			}
		}
	})
	return p
}

// baseEnv is the test's environment without ALLOT_ variables, so that the
// processes see only what the scenario sets.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ALLOT_") {
			env = append(env, kv)
		}
	}
	return env
}

// start runs a new incarnation. It does not wait for readiness.
func (p *proc) start() (*incarnation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.runs); n > 0 && p.runs[n-1].alive() {
		return nil, fmt.Errorf("%s is already running", p.name)
	}
	r := &incarnation{n: len(p.runs) + 1, output: newTail(1 << 20), done: make(chan struct{})}
	r.cmd = exec.Command(p.path, p.args...)
	r.cmd.Env = p.env
	r.cmd.Stdout = r.output
	r.cmd.Stderr = r.output
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", p.name, err)
	}
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	p.runs = append(p.runs, r)
	return r, nil
}

// current is the latest incarnation, nil before the first start.
func (p *proc) current() *incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.runs) == 0 {
		return nil
	}
	return p.runs[len(p.runs)-1]
}

// kill sends SIGKILL to the running incarnation and waits until it is gone.
func (p *proc) kill() error {
	r := p.current()
	if r == nil || !r.alive() {
		return fmt.Errorf("kill %s: not running", p.name)
	}
	if err := r.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	select {
	case <-r.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("kill %s: still running 10s after SIGKILL", p.name)
	}
}

// signal sends sig to the running incarnation. SIGSTOP returns only once
// every thread of it has stopped: the kernel stops a process when a thread
// of it next handles the signal, which a thread in a long system call (an
// fsync on a slow disk) does only when the call returns, and the process's
// other threads run on meanwhile.
func (p *proc) signal(sig syscall.Signal) error {
	r := p.current()
	if r == nil || !r.alive() {
		return fmt.Errorf("signal %s: not running", p.name)
	}
	if err := r.cmd.Process.Signal(sig); err != nil {
		return err
	}
	if sig != syscall.SIGSTOP {
		return nil
	}
	pid := r.cmd.Process.Pid
	deadline := time.Now().Add(10 * time.Second)
	for {
		stopped, err := allThreadsStopped(pid)
		if err != nil || stopped {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("signal %s: not every thread stopped 10s after SIGSTOP", p.name)
		}
		time.Sleep(time.Millisecond)
	}
}

// allThreadsStopped reports whether every thread of process pid is in the
// stopped state, from /proc.
func allThreadsStopped(pid int) (bool, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("threads of %d: %w", pid, err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread exited
		}
		if err != nil {
			return false, fmt.Errorf("thread %s of %d: %w", task.Name(), pid, err)
		}
		// "tid (comm) state ...": comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return false, fmt.Errorf("thread %s of %d: unreadable stat %q", task.Name(), pid, b)
		}
		if state := b[i+2]; state != 'T' && state != 't' {
			return false, nil
		}
	}
	return true, nil
}

// stop sends SIGTERM and waits up to timeout for the exit; it returns an
// error unless the process exited with status 0.
func (p *proc) stop(timeout time.Duration) error {
	r := p.current()
	if r == nil || !r.alive() {
		return fmt.Errorf("stop %s: not running (%s)", p.name, r.exitText())
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s: %w", p.name, err)
	}
	select {
	case <-r.done:
	case <-time.After(timeout):
		return fmt.Errorf("stop %s: still running %s after SIGTERM", p.name, timeout)
	}
	if r.err != nil {
		return fmt.Errorf("stop %s: %s after SIGTERM, want exit status 0", p.name, r.exitText())
	}
	return nil
}

// pid is the process id of the running incarnation.
func (p *proc) pid() int {
	if r := p.current(); r != nil {
		return r.cmd.Process.Pid
	}
	return 0
}

// alive reports whether the latest incarnation is running.
func (p *proc) alive() bool {
	r := p.current()
	return r != nil && r.alive()
}

// exited returns an error describing the exit when the latest incarnation
// is not running, with the end of its output.
func (p *proc) exited() error {
	r := p.current()
	if r == nil || r.alive() {
		return nil
	}
	out := r.output.String()
	if len(out) > 2000 {
		out = out[len(out)-2000:]
	}
	return fmt.Errorf("%s#%d exited (%s); output ends with:\n%s", p.name, r.n, r.exitText(), out)
}

func (r *incarnation) alive() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

func (r *incarnation) exitText() string {
	if r == nil {
		return "never started"
	}
	if r.alive() {
		return "running"
	}
	if r.err == nil {
		return "exit status 0"
	}
	return r.err.Error()
}

// rssKiB reads VmRSS of the running incarnation from /proc.
func (p *proc) rssKiB() (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmRSS line in /proc status")
}

// tail keeps the last cap bytes written to it.
type tail struct {
	mu  sync.Mutex
	cap int
	b   []byte
}

func newTail(n int) *tail { return &tail{cap: n} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.cap; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// freePort asks the kernel for a free TCP port on 127.0.0.1. Another
// process could take it before it is used; on this machine that is rare
// enough, and a start then fails loudly.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// poll calls cond every 25ms until it reports true, its process died or
// timeout passes. It never calls t.Fatal, so fault goroutines use it too.
func poll(timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if errors.Is(err, errDied) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s (last error: %v)", what, timeout, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// errDied makes poll give up at once.
var errDied = errors.New("the process died")

// httpReady reports whether GET url answers 200; it reports errDied once
// p has exited.
func httpReady(p *proc, url string) func() (bool, error) {
	cl := &http.Client{Timeout: time.Second}
	return func() (bool, error) {
		if err := p.exited(); err != nil {
			return false, fmt.Errorf("%w: %w", errDied, err)
		}
		resp, err := cl.Get(url)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("GET %s: %d", url, resp.StatusCode)
		}
		return true, nil
	}
}

// tcpReady reports whether addr accepts connections; errDied once p exited.
func tcpReady(p *proc, addr string) func() (bool, error) {
	return func() (bool, error) {
		if err := p.exited(); err != nil {
			return false, fmt.Errorf("%w: %w", errDied, err)
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, err
		}
		c.Close()
		return true, nil
	}
}
