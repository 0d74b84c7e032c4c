package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/syncbuf"
	"github.com/allot-dev/allot/internal/wire"
)

// valid is the default configuration with a NATS URL: what Validate accepts.
func valid() cfg {
	c := cfg(config.Defaults[binaries.Notifier]())
	c.NATSURL = "nats://127.0.0.1:4222"
	return c
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*cfg)
		want   string // a part of the error; empty = valid
	}{
		{name: "defaults", change: func(*cfg) {}},
		{name: "webhook", change: func(c *cfg) { c.URL = "https://hooks.example.com/allot?token=x" }},
		{name: "metrics addr", change: func(c *cfg) { c.MetricsAddr = ":9092" }},
		{name: "filter on every event", change: func(c *cfg) { c.Filter = "alloc.evt.>" }},
		{name: "filter on one activity", change: func(c *cfg) { c.Filter = "alloc.evt.42.*" }},
		{name: "filter on expiries", change: func(c *cfg) { c.Filter = "alloc.evt.*.expired" }},
		{name: "filter on promotions and expiries", change: func(c *cfg) { c.Filter = "alloc.evt.*.promoted, alloc.evt.*.expired" }},
		{name: "one attempt, one worker", change: func(c *cfg) { c.MaxAttempts, c.Workers = 1, 1 }},
		{name: "equal backoffs", change: func(c *cfg) { c.BackoffMax = c.BackoffBase }},

		{name: "no NATS URL", change: func(c *cfg) { c.NATSURL = "" }, want: "ALLOT_NATS_URL is empty"},
		{name: "common checks still run", change: func(c *cfg) { c.LogLevel = "loud" }, want: "ALLOT_LOG_LEVEL"},
		{name: "relative webhook", change: func(c *cfg) { c.URL = "/hook" }, want: "ALLOT_NOTIFY_URL"},
		{name: "webhook without host", change: func(c *cfg) { c.URL = "http://" }, want: "ALLOT_NOTIFY_URL"},
		{name: "webhook other scheme", change: func(c *cfg) { c.URL = "ftp://example.com/x" }, want: "ALLOT_NOTIFY_URL"},
		{name: "empty filter", change: func(c *cfg) { c.Filter = "" }, want: "ALLOT_NOTIFY_FILTER"},
		{name: "filter outside the event stream", change: func(c *cfg) { c.Filter = "alloc.req.>" }, want: "ALLOT_NOTIFY_FILTER"},
		{name: "filter with an empty token", change: func(c *cfg) { c.Filter = "alloc.evt..promoted" }, want: "ALLOT_NOTIFY_FILTER"},
		{name: "filter with > not last", change: func(c *cfg) { c.Filter = "alloc.evt.>.promoted" }, want: "ALLOT_NOTIFY_FILTER"},
		{name: "filter with a partial wildcard", change: func(c *cfg) { c.Filter = "alloc.evt.*.pro*" }, want: "ALLOT_NOTIFY_FILTER"},
		{name: "filter with a space", change: func(c *cfg) { c.Filter = "alloc.evt.* .promoted" }, want: "ALLOT_NOTIFY_FILTER"},
		{name: "filters with an empty one", change: func(c *cfg) { c.Filter = "alloc.evt.*.promoted,," }, want: "ALLOT_NOTIFY_FILTER"},
		{name: "filters with one outside", change: func(c *cfg) { c.Filter = "alloc.evt.*.expired,alloc.req.>" }, want: "ALLOT_NOTIFY_FILTER"},
		{name: "the same filter twice", change: func(c *cfg) { c.Filter = "alloc.evt.*.held,alloc.evt.*.held" }, want: "ALLOT_NOTIFY_FILTER"},
		{name: "empty durable", change: func(c *cfg) { c.Durable = "" }, want: "ALLOT_NOTIFY_DURABLE"},
		{name: "durable with a dot", change: func(c *cfg) { c.Durable = "my.notifier" }, want: "ALLOT_NOTIFY_DURABLE"},
		{name: "zero timeout", change: func(c *cfg) { c.Timeout = 0 }, want: "ALLOT_NOTIFY_TIMEOUT"},
		{name: "huge timeout", change: func(c *cfg) { c.Timeout = time.Hour }, want: "ALLOT_NOTIFY_TIMEOUT"},
		{name: "zero attempts", change: func(c *cfg) { c.MaxAttempts = 0 }, want: "ALLOT_NOTIFY_MAX_ATTEMPTS"},
		{name: "too many attempts", change: func(c *cfg) { c.MaxAttempts = 1001 }, want: "ALLOT_NOTIFY_MAX_ATTEMPTS"},
		{name: "zero backoff base", change: func(c *cfg) { c.BackoffBase = 0 }, want: "ALLOT_NOTIFY_BACKOFF_BASE"},
		{name: "backoff max below base", change: func(c *cfg) { c.BackoffMax = time.Millisecond }, want: "ALLOT_NOTIFY_BACKOFF_MAX"},
		{name: "backoff max above an hour", change: func(c *cfg) { c.BackoffMax = 2 * time.Hour }, want: "ALLOT_NOTIFY_BACKOFF_MAX"},
		{name: "zero workers", change: func(c *cfg) { c.Workers = 0 }, want: "ALLOT_NOTIFY_WORKERS"},
		{name: "bad metrics addr", change: func(c *cfg) { c.MetricsAddr = "9092" }, want: "ALLOT_NOTIFY_METRICS_ADDR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := valid()
			tt.change(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && err == nil:
				t.Errorf("Validate() = nil, want an error about %s", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Errorf("Validate() = %v, want it to name %s", err, tt.want)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Errorf("Validate() = %q: more than one line", err)
			}
		})
	}
}

func TestSecretURLMasksCredentials(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
	}{
		{"", ""},
		{"https://hooks.example.com/allot", "https://hooks.example.com/allot"},
		{"https://bot:hunter2@hooks.example.com/allot", "https://bot:xxxxx@hooks.example.com/allot"},
		{"https://hooks.example.com/allot?token=hunter2", "https://hooks.example.com/allot?token=%2A%2A%2A%2A%2A"},
	}
	for _, tt := range tests {
		if got := secretURL(tt.in).String(); got != tt.want {
			t.Errorf("secretURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// The tests below set process environment variables: not parallel.

// lastLine is the last non-empty line of out.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

func TestRunFailsFastWithOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "nats://" + ln.Addr().String()
	ln.Close()

	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{name: "unreachable NATS", env: map[string]string{"ALLOT_NATS_URL": closedURL}, want: "ALLOT_NATS_URL"},
		{name: "no NATS URL", env: map[string]string{"ALLOT_NATS_URL": ""}, want: "ALLOT_NATS_URL is empty"},
		{name: "invalid value", env: map[string]string{"ALLOT_NATS_URL": closedURL, "ALLOT_NOTIFY_MAX_ATTEMPTS": "0"}, want: "ALLOT_NOTIFY_MAX_ATTEMPTS"},
		{name: "unparsable value", env: map[string]string{"ALLOT_NATS_URL": closedURL, "ALLOT_NOTIFY_TIMEOUT": "soon"}, want: "NOTIFY_TIMEOUT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var out bytes.Buffer
			start := time.Now()
			if code := run(context.Background(), &out); code != 2 {
				t.Errorf("run = %d, want 2; output:\n%s", code, out.String())
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("run took %s to fail", d)
			}
			line := lastLine(out.String())
			if !strings.HasPrefix(line, binary+": ") || !strings.Contains(line, tt.want) {
				t.Errorf("last line %q, want %q: … naming %s", line, binary, tt.want)
			}
		})
	}
}

func TestRunDeliversUntilSignalled(t *testing.T) {
	ns := natstest.New(t)
	ns.Setup(t, config.Defaults[bus.Config]())
	_, js := ns.Connect(t)

	var mu sync.Mutex
	got := map[string]string{} // Idempotency-Key → token query value
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.Header.Get("Idempotency-Key")] = r.URL.Query().Get("token")
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rcv.Close)

	t.Setenv("ALLOT_NATS_URL", ns.URL())
	t.Setenv("ALLOT_NOTIFY_URL", rcv.URL+"/hook?token=hunter2")
	t.Setenv("ALLOT_NOTIFY_DURABLE", "cmd-test")
	t.Setenv("ALLOT_NOTIFY_METRICS_ADDR", "127.0.0.1:0")
	var out syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, &out) }()

	// Started before the allocator: the notifier creates the event stream.
	ev := wire.Event{EventID: "0190b3a4-7c1e-7000-8000-000000000042", Kind: wire.EventPromoted, ActivityID: 9, UserID: 3, At: time.Now().UTC()}
	b, _ := json.Marshal(ev)
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := js.Publish(context.Background(), wire.EventSubject(9, wire.EventPromoted), b, jetstream.WithMsgID(ev.EventID))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish: %v; output:\n%s", err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		mu.Lock()
		token, ok := got[ev.EventID]
		mu.Unlock()
		if ok {
			if token != "hunter2" {
				t.Errorf("webhook called with token %q, want the configured one", token)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("event not delivered; output:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("run = %d after the signal, want 0; output:\n%s", code, out.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after the signal")
	}
	printed := out.String()
	if strings.Contains(printed, "hunter2") {
		t.Errorf("the webhook token was printed:\n%s", printed)
	}
	for _, want := range []string{"ALLOT_NOTIFY_URL=", "ALLOT_NOTIFY_FILTER=alloc.evt.*.promoted", "ALLOT_NOTIFY_DURABLE=cmd-test", "ALLOT_NOTIFY_MAX_ATTEMPTS=8"} {
		if !strings.Contains(printed, want) {
			t.Errorf("effective config lacks %s:\n%s", want, printed)
		}
	}
}
