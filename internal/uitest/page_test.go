package uitest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/loadgen"
	"github.com/allot-dev/allot/internal/stacktest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// stack is one test's running system: MariaDB, JetStream, an allocator and
// ingest behind an HTTP server, all in this process.
type stack struct {
	t   *testing.T
	js  jetstream.JetStream
	url string
}

func newStack(t *testing.T) *stack {
	t.Helper()
	st := stacktest.Start(t, config.Defaults[allocator.Config](), stacktest.IngestConfig(), ingest.Deps{})
	return &stack{t: t, js: st.JS, url: st.URL}
}

// activity reads GET /v1/activities/{a}, the numbers the page must show.
func (s *stack) activity(a int64) map[string]int64 {
	s.t.Helper()
	resp, err := http.Get(s.url + "/v1/activities/" + strconv.FormatInt(a, 10))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]int64
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&m) != nil {
		s.t.Fatalf("GET activity %d: %d", a, resp.StatusCode)
	}
	return m
}

// events is the number of events of activity a in ALLOT_EVENTS.
func (s *stack) events(a int64) int {
	s.t.Helper()
	st, err := s.js.Stream(context.Background(), wire.EventStream)
	if err != nil {
		s.t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(fmt.Sprintf("%s%d.>", wire.EventSubjectPrefix, a)))
	if err != nil {
		s.t.Fatal(err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}

// screen is what the page shows, read from the DOM.
type screen struct {
	Stream    string `json:"stream"`
	Capacity  string `json:"capacity"`
	Confirmed string `json:"confirmed"`
	Waiting   string `json:"waiting"`
	Remaining string `json:"remaining"`
	Lag       string `json:"lag"`
	Rate      string `json:"rate"`
	Banner    string `json:"banner"`
	Events    int    `json:"events"`
	Skipped   int    `json:"skipped"`
	FeedRows  int    `json:"feedRows"`
	Points    int    `json:"points"`
	SoldOut   bool   `json:"soldOut"`
}

const readScreen = `(() => {
  if (!document.body || !document.getElementById('chart')) return { stream: 'loading' };
  const text = (id) => document.getElementById(id).textContent.trim();
  const banner = document.getElementById('banner');
  return {
    stream: document.body.dataset.stream,
    capacity: text('capacity'), confirmed: text('confirmed'), waiting: text('waiting'),
    remaining: text('remaining'), lag: text('lag'), rate: text('rate'),
    banner: banner.hidden ? '' : banner.textContent,
    events: Number(document.body.dataset.events), skipped: Number(document.body.dataset.skipped),
    feedRows: document.querySelectorAll('#feed li:not(.empty)').length,
    points: Number(document.getElementById('chart').dataset.points),
    soldOut: !document.getElementById('sold-out').hidden,
  };
})()`

// number reads a number as the page prints it ("1,800"); -1 when it shows
// none.
func number(s string) int64 {
	n, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func (b *Browser) screen(t *testing.T) screen {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var s screen
	if err := b.Eval(ctx, readScreen, &s); err != nil {
		t.Fatalf("read the page: %v", err)
	}
	return s
}

// chromium is the browser to drive ($ALLOT_CHROMIUM, else Debian's); it
// skips t when there is none, and fails it on CI.
func chromium(t *testing.T) string {
	t.Helper()
	path := os.Getenv("ALLOT_CHROMIUM")
	if path == "" {
		path = ChromiumPath
	}
	if _, err := os.Stat(path); err != nil {
		testenv.Missing(t, fmt.Sprintf("no Chromium at %s: install Debian's chromium to run this test: apt-get install -y chromium", path))
	}
	return path
}

// launch starts the Chromium at path for t, closed when t ends.
func launch(t *testing.T, path string) *Browser {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := Launch(ctx, path, t.TempDir(), 1280, 900)
	if err != nil {
		t.Fatalf("launch Chromium: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Chromium's output ends with:\n%s", b.Output())
		}
		if err := b.Close(); err != nil {
			t.Errorf("close Chromium: %v", err)
		}
	})
	return b
}

// TestOperatorPageFollowsABurst opens the page on an activity before it
// exists, fires a launch-night burst at it (joins, cancels and claims from
// 1,800 users for 100 seats) while the page watches, and checks that what
// the page shows at the end is what the API says, that it received every
// event of the activity, and that it raised no script error. It saves a
// screenshot to the test's directory and to tmp/operator-page.png.
func TestOperatorPageFollowsABurst(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser and a burst of 2,000 requests")
	}
	path := chromium(t)
	s := newStack(t)
	b := launch(t, path) // after the stack: closed before the server, so no stream holds its close
	const act = 9001
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()

	if err := b.Navigate(ctx, fmt.Sprintf("%s/?activity=%d", s.url, act)); err != nil {
		t.Fatal(err)
	}
	waitScreen(t, b, 15*time.Second, "the page is live and says the activity is not open yet", func(sc screen) bool {
		return sc.Stream == "live" && strings.Contains(sc.Banner, "not open yet")
	})

	type result struct {
		rep loadgen.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		lcfg := config.Defaults[loadgen.Config]()
		lcfg.BaseURL = s.url
		lcfg.Activity = act
		lcfg.Capacity = 100
		lcfg.Requests = 2000
		lcfg.Users = 1800
		lcfg.Concurrency = 32
		lcfg.Mix = loadgen.Mix{Join: 0.7, Cancel: 0.15, Claim: 0.15}
		lcfg.Wait = 10 * time.Second
		rep, err := loadgen.Run(ctx, lcfg, loadgen.Deps{})
		done <- result{rep, err}
	}()

	// While the burst runs, the page follows it: its numbers move and
	// events scroll by before the last result is in.
	var (
		res         result
		liveSamples int
	)
	tick := time.NewTicker(150 * time.Millisecond)
burst:
	for {
		select {
		case res = <-done:
			break burst
		case <-tick.C:
			if sc := b.screen(t); sc.Events > 0 && number(sc.Confirmed) > 0 {
				liveSamples++
				if liveSamples == 3 { // a picture of the page mid-burst
					if png, err := b.Screenshot(ctx); err == nil {
						saveScreenshot(t, png, "operator-page-burst.png")
					}
				}
			}
		}
	}
	tick.Stop()
	if res.err != nil {
		t.Fatalf("loadgen: %v", res.err)
	}
	if err := res.rep.Verdict(); err != nil {
		t.Fatalf("the burst's own checks failed: %v", err)
	}
	t.Logf("burst: %d requests in %s, outcomes %v; the page showed progress in %d samples during it",
		res.rep.Requests, res.rep.ToLastResult.Round(time.Millisecond), res.rep.Outcomes, liveSamples)
	if liveSamples == 0 {
		t.Error("the page showed no event and no confirmed seat while the burst ran")
	}

	// Once the burst is over, the numbers on screen are the API's, and the
	// page got every event of the activity the stream holds.
	api := s.activity(act)
	var last screen
	deadline := time.Now().Add(15 * time.Second)
	for {
		last = b.screen(t)
		got := map[string]int64{
			"capacity": number(last.Capacity), "confirmed": number(last.Confirmed),
			"waiting": number(last.Waiting), "remaining": number(last.Remaining),
		}
		match := true
		for k, v := range got {
			if api[k] != v {
				match = false
			}
		}
		events := s.events(act)
		// Received means shown: an event the page skipped (it read too
		// slowly and the server dropped it) is not counted as received.
		if last.Skipped > 0 {
			t.Fatalf("the page skipped %d events (it received %d of %d): it did not follow the burst event by event",
				last.Skipped, last.Events, events)
		}
		if match && last.Events == events && last.Lag == "0" {
			t.Logf("on screen: capacity %s, confirmed %s, waiting %s, remaining %s, lag %s, rate %s/s; %d events received of %d stored; %d chart points",
				last.Capacity, last.Confirmed, last.Waiting, last.Remaining, last.Lag, last.Rate, last.Events, events, last.Points)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the burst the page shows %+v; the API says %v and the stream holds %d events", last, api, events)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if last.FeedRows == 0 || last.Points < 2 {
		t.Errorf("the page lists %d events and charts %d points, want some of each", last.FeedRows, last.Points)
	}
	if want := api["remaining"] == 0; last.SoldOut != want {
		t.Errorf("SOLD OUT badge shown = %v with %d seats remaining", last.SoldOut, api["remaining"])
	}
	if p := b.Problems(); len(p) > 0 {
		t.Errorf("the page reported problems:\n%s", strings.Join(p, "\n"))
	}

	// Let the chart's last segment and the rate settle, then keep a picture.
	time.Sleep(600 * time.Millisecond)
	png, err := b.Screenshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	saveScreenshot(t, png, "operator-page.png")
}

func waitScreen(t *testing.T, b *Browser, timeout time.Duration, what string, ok func(screen) bool) screen {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		sc := b.screen(t)
		if ok(sc) {
			return sc
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s; the page shows %+v; problems: %v", timeout, what, sc, b.Problems())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// saveScreenshot writes png as name to the test's directory and, for the
// engineer, to tmp/ at the module root (tmp/ is git-ignored).
func saveScreenshot(t *testing.T, png []byte, name string) {
	t.Helper()
	if len(png) < 8 || string(png[1:4]) != "PNG" {
		t.Fatalf("the screenshot is not a PNG (%d bytes)", len(png))
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := moduleRoot()
	if err != nil {
		t.Logf("screenshot at %s (no module root to copy it to: %v)", path, err)
		return
	}
	dir := filepath.Join(root, "tmp")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(dir, name)
	if err := os.WriteFile(keep, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d KiB)", keep, len(png)>>10)
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}

// TestIngestMountsThePage checks the page's routes through ingest's real
// handler, without a browser.
func TestIngestMountsThePage(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	do := func(method, path string, header ...string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, s.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	tests := []struct {
		name, method, path, accept string
		want                       int
		wantType                   string
	}{
		{name: "page for a browser", method: "GET", path: "/", accept: "text/html,*/*;q=0.8", want: 200, wantType: "text/html"},
		{name: "page with a query", method: "GET", path: "/?activity=9001", accept: "text/html", want: 200, wantType: "text/html"},
		{name: "root for an API client", method: "GET", path: "/", want: 404, wantType: "application/json"},
		{name: "root for curl", method: "GET", path: "/", accept: "*/*", want: 404, wantType: "application/json"},
		{name: "script", method: "GET", path: "/ui/app.js", want: 200, wantType: "javascript"},
		{name: "stylesheet", method: "GET", path: "/ui/app.css", want: 200, wantType: "text/css"},
		{name: "unknown asset", method: "GET", path: "/ui/nope.js", want: 404, wantType: "application/json"},
		{name: "asset dir", method: "GET", path: "/ui/", want: 404, wantType: "application/json"},
		{name: "nested asset", method: "GET", path: "/ui/a/b.js", want: 404, wantType: "application/json"},
		{name: "live bad id", method: "GET", path: "/v1/activities/abc/live", want: 400, wantType: "application/json"},
		{name: "live zero id", method: "GET", path: "/v1/activities/0/live", want: 400, wantType: "application/json"},
		{name: "live too deep", method: "GET", path: "/v1/activities/1/live/x", want: 404, wantType: "application/json"},
		{name: "live HEAD", method: "HEAD", path: "/v1/activities/1/live", want: 200, wantType: "text/event-stream"},
		{name: "live POST", method: "POST", path: "/v1/activities/1/live", want: 405, wantType: "application/json"},
	}
	for _, tt := range tests {
		var h []string
		if tt.accept != "" {
			h = []string{"Accept", tt.accept}
		}
		resp, body := do(tt.method, tt.path, h...)
		if resp.StatusCode != tt.want || !strings.Contains(resp.Header.Get("Content-Type"), tt.wantType) {
			t.Errorf("%s (%s %s): %d %q, want %d %s; body %q", tt.name, tt.method, tt.path,
				resp.StatusCode, resp.Header.Get("Content-Type"), tt.want, tt.wantType, body)
		}
	}

	// The feed itself, through ingest: a state first.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/v1/activities/77/live", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var lines []string
	for sc.Scan() && len(lines) < 4 {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 4 || lines[2] != "event: state" || !strings.HasPrefix(lines[3], `data: {"activity_id":77,"opened":false`) {
		t.Fatalf("the feed starts with %q, want retry, a blank line and a state of activity 77", lines)
	}
	cancel()
}
