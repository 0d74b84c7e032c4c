package uitest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ChromiumPath is where Debian's chromium package installs the browser.
const ChromiumPath = "/usr/bin/chromium"

// ErrBrowserGone is wrapped by the errors of calls made after Chromium
// exited or closed its end of the pipe.
var ErrBrowserGone = errors.New("chromium is gone")

// Browser is one headless Chromium with one page, driven over the DevTools
// protocol: NUL-terminated JSON messages on file descriptors 3 (to Chromium)
// and 4 (from Chromium).
type Browser struct {
	cmd     *exec.Cmd
	out     *os.File // to Chromium's fd 3
	in      *os.File // from Chromium's fd 4
	session string   // the page's flat session
	stderr  *tail
	gone    chan struct{} // closed when the reader stops

	writeMu sync.Mutex
	mu      sync.Mutex
	nextID  int64
	waiting map[int64]chan reply
	logs    []string // console errors and uncaught exceptions of the page
}

type reply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Launch starts Chromium at path in headless mode with a fresh profile in
// profileDir and a width×height page, the flags this machine needs (no
// sandbox as root, no network beyond localhost), and attaches to its page.
func Launch(ctx context.Context, path, profileDir string, width, height int) (*Browser, error) {
	toChrome, out, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	in, fromChrome, err := os.Pipe()
	if err != nil {
		toChrome.Close()
		out.Close()
		return nil, err
	}
	b := &Browser{out: out, in: in, stderr: &tail{max: 16 << 10}, gone: make(chan struct{}), waiting: make(map[int64]chan reply)}
	b.cmd = exec.Command(path,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
		"--disable-features=Translate,MediaRouter,OptimizationHints",
		fmt.Sprintf("--window-size=%d,%d", width, height),
		"--user-data-dir="+profileDir,
		"--remote-debugging-pipe",
		"about:blank")
	b.cmd.ExtraFiles = []*os.File{toChrome, fromChrome} // fd 3, fd 4
	b.cmd.Stdout, b.cmd.Stderr = b.stderr, b.stderr
	// Its own process group, so that Close can end the renderers too if
	// the browser does not exit by itself.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = b.cmd.Start()
	toChrome.Close()
	fromChrome.Close()
	if err != nil {
		out.Close()
		in.Close()
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	go b.read()

	if err := b.attach(ctx, width, height); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Browser) attach(ctx context.Context, width, height int) error {
	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := b.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target); err != nil {
		return err
	}
	var att struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att); err != nil {
		return err
	}
	b.session = att.SessionID
	for _, c := range []struct {
		method string
		params map[string]any
	}{
		{"Page.enable", nil},
		{"Runtime.enable", nil},
		{"Log.enable", nil},
		{"Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}},
	} {
		if err := b.call(ctx, b.session, c.method, c.params, nil); err != nil {
			return err
		}
	}
	return nil
}

// read dispatches Chromium's messages: replies to their callers, page
// problems to logs.
func (b *Browser) read() {
	defer close(b.gone)
	r := bufio.NewReaderSize(b.in, 1<<20)
	for {
		raw, err := r.ReadBytes(0)
		if err != nil {
			return
		}
		var m struct {
			ID     int64           `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
			reply
		}
		if json.Unmarshal(raw[:len(raw)-1], &m) != nil {
			continue
		}
		if m.ID != 0 {
			b.mu.Lock()
			ch := b.waiting[m.ID]
			delete(b.waiting, m.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- m.reply
			}
			continue
		}
		if p := problem(m.Method, m.Params); p != "" {
			b.mu.Lock()
			b.logs = append(b.logs, p)
			b.mu.Unlock()
		}
	}
}

// problem describes an event that shows the page misbehaving, or is "".
func problem(method string, params json.RawMessage) string {
	switch method {
	case "Runtime.exceptionThrown":
		var p struct {
			Details struct {
				Text      string `json:"text"`
				Exception struct {
					Description string `json:"description"`
				} `json:"exception"`
			} `json:"exceptionDetails"`
		}
		json.Unmarshal(params, &p) //nolint:errcheck // best effort
		return "uncaught: " + p.Details.Text + " " + p.Details.Exception.Description
	case "Runtime.consoleAPICalled":
		var p struct {
			Type string `json:"type"`
			Args []struct {
				Value       any    `json:"value"`
				Description string `json:"description"`
			} `json:"args"`
		}
		json.Unmarshal(params, &p) //nolint:errcheck
		if p.Type != "error" && p.Type != "assert" {
			return ""
		}
		var parts []string
		for _, a := range p.Args {
			parts = append(parts, fmt.Sprint(a.Value)+a.Description)
		}
		return "console." + p.Type + ": " + strings.Join(parts, " ")
	case "Log.entryAdded":
		var p struct {
			Entry struct {
				Level  string `json:"level"`
				Source string `json:"source"`
				Text   string `json:"text"`
				URL    string `json:"url"`
			} `json:"entry"`
		}
		json.Unmarshal(params, &p) //nolint:errcheck
		if p.Entry.Level != "error" {
			return ""
		}
		return p.Entry.Source + ": " + p.Entry.Text + " " + p.Entry.URL
	}
	return ""
}

// call sends one command (to the page's session when session is set) and
// decodes its result into out, when out is not nil.
func (b *Browser) call(ctx context.Context, session, method string, params, out any) error {
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan reply, 1)
	b.waiting[id] = ch
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.waiting, id)
		b.mu.Unlock()
	}()
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	b.writeMu.Lock()
	_, err = b.out.Write(append(data, 0))
	b.writeMu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBrowserGone, method, err)
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			return fmt.Errorf("%s: %s (%d)", method, r.Error.Message, r.Error.Code)
		}
		if out != nil {
			return json.Unmarshal(r.Result, out)
		}
		return nil
	case <-b.gone:
		return fmt.Errorf("%w during %s; its output ends with:\n%s", ErrBrowserGone, method, b.stderr)
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// Navigate loads url in the page and waits for the navigation to commit.
func (b *Browser) Navigate(ctx context.Context, url string) error {
	var r struct {
		ErrorText string `json:"errorText"`
	}
	if err := b.call(ctx, b.session, "Page.navigate", map[string]any{"url": url}, &r); err != nil {
		return err
	}
	if r.ErrorText != "" {
		return fmt.Errorf("navigate to %s: %s", url, r.ErrorText)
	}
	return nil
}

// Eval evaluates a JavaScript expression in the page and decodes its value
// (which must be JSON-serialisable) into out.
func (b *Browser) Eval(ctx context.Context, expr string, out any) error {
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := b.call(ctx, b.session, "Runtime.evaluate", map[string]any{
		"expression": expr, "returnByValue": true, "awaitPromise": true,
	}, &r); err != nil {
		return err
	}
	if r.Exception != nil {
		return fmt.Errorf("evaluate %q: %s %s", expr, r.Exception.Text, r.Exception.Exception.Description)
	}
	if out == nil || len(r.Result.Value) == 0 {
		return nil
	}
	return json.Unmarshal(r.Result.Value, out)
}

// Screenshot captures the page's viewport as a PNG.
func (b *Browser) Screenshot(ctx context.Context) ([]byte, error) {
	var r struct {
		Data string `json:"data"`
	}
	if err := b.call(ctx, b.session, "Page.captureScreenshot", map[string]any{"format": "png"}, &r); err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(r.Data)
}

// Problems returns the console errors, failed loads and uncaught
// exceptions the page has reported so far.
func (b *Browser) Problems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.logs...)
}

// Output is the end of Chromium's own output, for failure messages.
func (b *Browser) Output() string { return b.stderr.String() }

// Close asks Chromium to exit and waits for it; after 5 seconds it kills
// Chromium's process group (which Launch created for it alone).
func (b *Browser) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	b.call(ctx, "", "Browser.close", nil, nil) //nolint:errcheck // it may be gone already
	cancel()
	b.out.Close()
	exited := make(chan error, 1)
	go func() { exited <- b.cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(5 * time.Second):
		syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
		err = <-exited
	}
	b.in.Close()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return nil // killed or exited non-zero on the way out: closed all the same
	}
	return err
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if extra := t.buf.Len() - t.max; extra > 0 {
		t.buf.Next(extra)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

var _ io.Writer = (*tail)(nil)
