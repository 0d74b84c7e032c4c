package uitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// ChromiumPath is where Debian's chromium package installs the browser.
const ChromiumPath = "/usr/bin/chromium"

// Browser is one headless Chromium with one page, driven with chromedp.
type Browser struct {
	page        context.Context // the page's chromedp context
	closePage   context.CancelFunc
	closeBrowse context.CancelFunc
	stderr      *tail

	mu   sync.Mutex
	logs []string // console errors, failed loads and uncaught exceptions of the page
}

// Launch starts Chromium at path in headless mode with a fresh profile in
// profileDir and a width×height page, with the flags this machine needs
// (no sandbox as root, no GPU, no QUIC), and opens its page. ctx bounds the
// start.
func Launch(ctx context.Context, path, profileDir string, width, height int) (*Browser, error) {
	b := &Browser{stderr: &tail{max: 16 << 10}}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(profileDir),
		chromedp.WindowSize(width, height),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
		chromedp.CombinedOutput(b.stderr),
	)
	actx, closeBrowser := chromedp.NewExecAllocator(context.Background(), opts...)
	page, closePage := chromedp.NewContext(actx, chromedp.WithListener(b.listen))
	b.page, b.closePage, b.closeBrowse = page, closePage, closeBrowser
	// The first call starts the browser and opens the page, on the page's
	// own context (chromedp ties the browser's life to it: a derived
	// context would close the browser when it ends). ctx ending during the
	// start closes everything. The log domain reports failed loads.
	stop := context.AfterFunc(ctx, closePage)
	_, err := chromedp.Call(page, cdplog.Enable, cdp.Empty{})
	stop()
	if err != nil {
		b.Close() // the start failed; that error is the one to report
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	return b, nil
}

// bounded runs f on the page, cut short when ctx ends.
func (b *Browser) bounded(ctx context.Context, f func(context.Context) error) error {
	c, cancel := context.WithCancel(b.page)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	return f(c)
}

// listen keeps the events that show the page misbehaving.
func (b *Browser) listen(ev any) {
	var p string
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		p = "uncaught: " + d.Text
		if d.Exception != nil {
			p += " " + d.Exception.Description
		}
	case *runtime.EventConsoleAPICalled:
		if ev.Type != runtime.ConsoleAPICalledTypeError && ev.Type != runtime.ConsoleAPICalledTypeAssert {
			return
		}
		var parts []string
		for _, a := range ev.Args {
			parts = append(parts, strings.TrimSpace(string(a.Value)+" "+a.Description))
		}
		p = "console." + string(ev.Type) + ": " + strings.Join(parts, " ")
	case *cdplog.EventEntryAdded:
		if ev.Entry.Level != cdplog.EntryLevelError {
			return
		}
		p = string(ev.Entry.Source) + ": " + ev.Entry.Text + " " + ev.Entry.URL
	default:
		return
	}
	b.mu.Lock()
	b.logs = append(b.logs, p)
	b.mu.Unlock()
}

// Navigate loads url in the page and waits for it to load.
func (b *Browser) Navigate(ctx context.Context, url string) error {
	return b.bounded(ctx, func(c context.Context) error {
		_, err := chromedp.Run(c, chromedp.Navigate(url))
		return err
	})
}

// Eval evaluates a JavaScript expression in the page (awaiting a promise)
// and decodes its value, which must be JSON-serialisable, into out.
func (b *Browser) Eval(ctx context.Context, expr string, out any) error {
	return b.bounded(ctx, func(c context.Context) error {
		v, err := chromedp.Run(c, chromedp.Evaluate[json.RawMessage](expr, chromedp.EvalAwaitPromise))
		if err != nil {
			return fmt.Errorf("evaluate %q: %w", expr, err)
		}
		if out == nil || len(v) == 0 {
			return nil
		}
		return json.Unmarshal(v, out)
	})
}

// Screenshot captures the page's viewport as a PNG.
func (b *Browser) Screenshot(ctx context.Context) ([]byte, error) {
	var png []byte
	err := b.bounded(ctx, func(c context.Context) error {
		var err error
		png, err = chromedp.Run(c, chromedp.CaptureScreenshot())
		return err
	})
	return png, err
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

// Close closes the page and the browser and waits for Chromium to exit.
func (b *Browser) Close() error {
	err := chromedp.Cancel(b.page)
	b.closePage()
	b.closeBrowse()
	if err != nil && !strings.Contains(err.Error(), "canceled") {
		return err
	}
	return nil
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
