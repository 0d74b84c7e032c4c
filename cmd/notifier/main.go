// Command notifier is allot's reference consumer of events: it delivers the
// events its durable consumer selects (alloc.evt.*.promoted by default) to a
// webhook, or logs them when ALLOT_NOTIFY_URL is empty. Wiring only: the
// work is in internal/notifier. It never connects to MySQL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/lifecycle"
	"github.com/allot-dev/allot/internal/notifier"
	"github.com/allot-dev/allot/internal/tracing"
	"github.com/allot-dev/allot/internal/wire"
)

const binary = "notifier"

// secretURL is a webhook URL that prints masked.
type secretURL = binaries.SecretURL

type cfg binaries.Notifier

// durableName is what NATS accepts as a consumer name, kept conservative.
var durableName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (c *cfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return errors.New("ALLOT_NATS_URL is empty: set it to your NATS server with JetStream")
	}
	if c.NotifyURL != "" {
		u, err := url.Parse(string(c.NotifyURL))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("ALLOT_NOTIFY_URL must be an absolute http:// or https:// URL, got %q", c.NotifyURL.String())
		}
	}
	if err := validFilter(c.NotifyFilter); err != nil {
		return err
	}
	if !durableName.MatchString(c.NotifyDurable) {
		return fmt.Errorf("ALLOT_NOTIFY_DURABLE must be 1 to 64 letters, digits, '-' or '_', got %q", c.NotifyDurable)
	}
	if c.NotifyTimeout <= 0 || c.NotifyTimeout > 10*time.Minute {
		return fmt.Errorf("ALLOT_NOTIFY_TIMEOUT must be above 0 and at most 10m, got %s", c.NotifyTimeout)
	}
	if c.NotifyMaxAttempts < 1 || c.NotifyMaxAttempts > 1000 {
		return fmt.Errorf("ALLOT_NOTIFY_MAX_ATTEMPTS must be between 1 and 1000, got %d", c.NotifyMaxAttempts)
	}
	if c.NotifyBackoffBase <= 0 {
		return fmt.Errorf("ALLOT_NOTIFY_BACKOFF_BASE must be above 0, got %s", c.NotifyBackoffBase)
	}
	if c.NotifyBackoffMax < c.NotifyBackoffBase || c.NotifyBackoffMax > time.Hour {
		return fmt.Errorf("ALLOT_NOTIFY_BACKOFF_MAX must be between ALLOT_NOTIFY_BACKOFF_BASE (%s) and 1h, got %s", c.NotifyBackoffBase, c.NotifyBackoffMax)
	}
	if c.NotifyWorkers < 1 || c.NotifyWorkers > 256 {
		return fmt.Errorf("ALLOT_NOTIFY_WORKERS must be between 1 and 256, got %d", c.NotifyWorkers)
	}
	if c.NotifyMetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.NotifyMetricsAddr); err != nil {
			return fmt.Errorf("ALLOT_NOTIFY_METRICS_ADDR must be host:port or :port, got %q", c.NotifyMetricsAddr)
		}
	}
	return nil
}

// validFilter accepts NATS subjects within alloc.evt.>, separated by
// commas: whole-token wildcards only, '>' last.
func validFilter(filter string) error {
	bad := fmt.Errorf("ALLOT_NOTIFY_FILTER must be subjects within %s> such as %s or %s,%s*.%s, got %q",
		wire.EventSubjectPrefix, notifier.DefaultFilter, notifier.DefaultFilter, wire.EventSubjectPrefix, wire.EventExpired, filter)
	parts := strings.Split(filter, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
		if validSubject(parts[i]) != nil || slices.Index(parts, parts[i]) < i {
			return bad
		}
	}
	return nil
}

// validSubject accepts one NATS subject within alloc.evt.>.
func validSubject(f string) error {
	bad := errors.New("not a subject within " + wire.EventSubjectPrefix + ">")
	if !strings.HasPrefix(f, wire.EventSubjectPrefix) {
		return bad
	}
	tokens := strings.Split(f, ".")
	for i, tok := range tokens {
		switch {
		case tok == "", strings.ContainsAny(tok, " \t\r\n"):
			return bad
		case tok == ">" && i != len(tokens)-1:
			return bad
		case tok != "*" && tok != ">" && strings.ContainsAny(tok, "*>"):
			return bad
		}
	}
	return nil
}

func (c *cfg) notifierConfig() notifier.Config {
	return notifier.Config{
		URL:         string(c.NotifyURL),
		Filter:      c.NotifyFilter,
		Durable:     c.NotifyDurable,
		Timeout:     c.NotifyTimeout,
		MaxAttempts: c.NotifyMaxAttempts,
		BackoffBase: c.NotifyBackoffBase,
		BackoffMax:  c.NotifyBackoffMax,
		Workers:     c.NotifyWorkers,
	}
}

func main() {
	// No flags but -version and -h: the settings are ALLOT_ variables.
	if code := config.ParseFlags(flag.NewFlagSet(binary, flag.ContinueOnError), os.Args[1:]); code >= 0 {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Stderr))
}

// run is main without the process: exit code 0 after a signal, 1 when the
// notifier fails while running, 2 on bad config or an unreachable broker.
func run(ctx context.Context, stderr io.Writer) int {
	var c cfg
	if err := config.Load(&c); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	config.Print(stderr, binary, &c)
	log := c.Logger(stderr, binary)
	stopTracing, err := tracing.Setup(ctx, "allot-"+binary)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	defer tracing.Flush(stopTracing, log)
	nc, err := c.ConnectNATS(binary, log)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	defer nc.Drain() //nolint:errcheck

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	n, err := notifier.New(nc, log, reg, c.notifierConfig())
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	if err := n.Start(ctx); bus.IsSetupError(err) {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	} else if err != nil {
		fmt.Fprintf(stderr, "%s: %v — is JetStream enabled on the server at ALLOT_NATS_URL?\n", binary, err)
		return 2
	}

	parts := []lifecycle.Part{{Name: "notifier", Run: func(ctx context.Context) error {
		defer context.AfterFunc(ctx, func() {
			log.Info("notifier stopping: finishing the attempts in flight")
			n.Stop()
		})()
		return n.Wait()
	}}}
	if c.NotifyMetricsAddr != "" {
		ln, err := net.Listen("tcp", c.NotifyMetricsAddr)
		if err != nil {
			n.Stop()
			fmt.Fprintf(stderr, "%s: listen %s: %v\n", binary, c.NotifyMetricsAddr, err)
			return 2
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			w.Write([]byte(`{"status":"ok"}`)) //nolint:errcheck // the client is gone; nothing to do
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		parts = append(parts, lifecycle.HTTPServer("metrics", srv, ln, 5*time.Second, nil))
	}
	if err := lifecycle.Run(ctx, parts...); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 1
	}
	return 0
}
