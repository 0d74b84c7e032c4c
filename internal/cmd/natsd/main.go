// Command natsd runs allot's embedded JetStream server (bus.RunServer) as a
// process of its own: file storage under a store directory, a configurable
// fsync interval. The fault-injection suite kills and restarts it on the same
// store directory; it also serves local clusters of separate allocator and
// ingest processes.
//
//	natsd [-host H] [-port P] [-store DIR] [-sync DURATION]
//	      [-cluster NAME -name NODE -cluster-port P -routes nats-route://h:p,...]
//
// With -cluster it is one node of a JetStream cluster on the given route
// port, joined to the other nodes' routes: how the fault suite runs a real
// three-node cluster of separate processes.
//
// Flags override the ALLOT_EMBEDDED_NATS_* variables. It prints its client
// URL as the one line of stdout once it accepts connections, logs to stderr,
// and shuts down cleanly (exit 0) on SIGTERM or SIGINT. Exit 2 means invalid
// configuration or a server that could not start.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
)

const binary = "natsd"

// cfg is natsd's configuration: ALLOT_ variables, then flags.
type cfg binaries.Natsd

// Validate reports the first invalid value as one sentence.
func (c *cfg) Validate() error {
	if c.Host == "" {
		return errors.New("the host (-host, ALLOT_EMBEDDED_NATS_HOST) must not be empty")
	}
	if c.Port < -1 || c.Port > 65535 {
		return fmt.Errorf("the port (-port, ALLOT_EMBEDDED_NATS_PORT) must be -1, 0 (a free port) or 1..65535, got %d", c.Port)
	}
	if c.Store == "" {
		return errors.New("the store directory (-store, ALLOT_EMBEDDED_NATS_STORE) must not be empty")
	}
	if c.Sync < 0 {
		return fmt.Errorf("the sync interval (-sync, ALLOT_EMBEDDED_NATS_SYNC) must not be negative, got %s", c.Sync)
	}
	if c.Cluster != "" && (c.Name == "" || c.ClusterPort <= 0 || c.ClusterPort > 65535 || c.Routes == "") {
		return errors.New("a cluster node (-cluster) needs -name, -cluster-port (1..65535) and -routes")
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// load reads the environment, then the flags, which override it.
func load(args []string, stderr io.Writer) (cfg, error) {
	var c cfg
	// Not config.Load: it validates, and flags may still override a value.
	if err := envconfig.Process(config.Prefix, &c); err != nil {
		return c, fmt.Errorf("read configuration: %w", err)
	}
	fs := flag.NewFlagSet(binary, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Host, "host", c.Host, "listen host (ALLOT_EMBEDDED_NATS_HOST)")
	fs.IntVar(&c.Port, "port", c.Port, "client port, -1 or 0 for a free one (ALLOT_EMBEDDED_NATS_PORT)")
	fs.StringVar(&c.Store, "store", c.Store, "JetStream store directory (ALLOT_EMBEDDED_NATS_STORE)")
	fs.DurationVar(&c.Sync, "sync", c.Sync, "fsync interval, 0 = always (ALLOT_EMBEDDED_NATS_SYNC)")
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "cluster name; empty = a single server (ALLOT_EMBEDDED_NATS_CLUSTER)")
	fs.StringVar(&c.Name, "name", c.Name, "this node's server name (ALLOT_EMBEDDED_NATS_NAME)")
	fs.IntVar(&c.ClusterPort, "cluster-port", c.ClusterPort, "route port of this node (ALLOT_EMBEDDED_NATS_CLUSTER_PORT)")
	fs.StringVar(&c.Routes, "routes", c.Routes, "comma-separated route URLs of the nodes (ALLOT_EMBEDDED_NATS_ROUTES)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return c, c.Validate()
}

// run returns the exit code: 0 after a clean shutdown, 2 when the
// configuration is invalid or the server does not start.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := load(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	config.Print(stderr, binary, &c)
	dir, err := filepath.Abs(c.Store)
	if err != nil {
		fmt.Fprintf(stderr, "%s: store directory %q: %v\n", binary, c.Store, err)
		return 2
	}
	port := c.Port
	if port == 0 {
		port = -1 // the server reads 0 as its default port, 4222
	}
	scfg := bus.ServerConfig{Host: c.Host, Port: port, StoreDir: dir, SyncInterval: c.Sync}
	if c.Cluster != "" {
		scfg.Cluster = bus.ClusterConfig{Name: c.Cluster, ServerName: c.Name, Host: c.Host, Port: c.ClusterPort,
			Routes: strings.Split(c.Routes, ",")}
	}
	srv, err := bus.RunServer(scfg)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v — pick another port with -port (-cluster-port for routes)\n", binary, err)
		return 2
	}
	sync := "always"
	if c.Sync > 0 {
		sync = c.Sync.String()
	}
	fmt.Fprintf(stderr, "%s: JetStream running at %s (store %s, sync %s)\n", binary, srv.ClientURL(), dir, sync)
	// The one line of stdout: scripts and the fault suite read the URL here.
	fmt.Fprintln(stdout, srv.ClientURL())

	<-ctx.Done()
	fmt.Fprintf(stderr, "%s: shutting down\n", binary)
	srv.Shutdown()
	srv.WaitForShutdown()
	fmt.Fprintf(stderr, "%s: stopped\n", binary)
	return 0
}
