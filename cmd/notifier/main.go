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
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/notifier"
	"github.com/allot-dev/allot/internal/tracing"
)

const binary = "notifier"

// secretURL is a webhook URL that prints masked.
type secretURL = notifier.SecretURL

// cfg is the notifier's configuration, read from ALLOT_ variables.
type cfg binaries.Notifier

// Validate reports the first invalid value as one sentence.
func (c *cfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return errors.New("ALLOT_NATS_URL is empty: set it to your NATS server with JetStream")
	}
	return c.Config.Validate()
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
	deps := notifier.Deps{NC: nc, Log: log, Registry: reg, Gatherer: reg}
	if c.MetricsAddr != "" {
		ln, err := net.Listen("tcp", c.MetricsAddr)
		if err != nil {
			fmt.Fprintf(stderr, "%s: listen %s: %v\n", binary, c.MetricsAddr, err)
			return 2
		}
		deps.Metrics = ln
	}
	err = notifier.Run(ctx, c.Config, deps)
	if se, ok := errors.AsType[*notifier.StartError](err); ok {
		if bus.IsSetupError(se.Err) {
			fmt.Fprintf(stderr, "%s: %v\n", binary, se.Err)
		} else {
			fmt.Fprintf(stderr, "%s: %v — is JetStream enabled on the server at ALLOT_NATS_URL?\n", binary, se.Err)
		}
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 1
	}
	return 0
}
