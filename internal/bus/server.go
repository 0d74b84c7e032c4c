// Package bus owns allot's JetStream side: the embedded server used by
// `make run` and the tests, connecting (each role with its own inbox
// prefix), the streams and buckets (Setup, `allotctl setup`, and the checks
// the runtime binaries run at start), the allocator's durable consumer,
// and publishing with Nats-Msg-Id.
package bus

import (
	"cmp"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ServerConfig configures an embedded JetStream server.
type ServerConfig struct {
	Host     string
	Port     int // -1 picks a free port
	StoreDir string
	// SyncInterval is how often the file store fsyncs; 0 means "always"
	// (every write is on disk before it is acknowledged).
	SyncInterval time.Duration
	// Cluster, when its Name is set, makes the server one node of a
	// JetStream cluster (see ClusterConfig).
	Cluster ClusterConfig
}

// ClusterConfig joins an embedded server to a JetStream cluster: every
// node has the same Name and lists the others' route URLs.
type ClusterConfig struct {
	// Name is the cluster's name, the same on every node.
	Name string
	// ServerName names this node; unique in the cluster.
	ServerName string
	// Host and Port are where this node listens for routes.
	Host string
	Port int
	// Routes are the other nodes' route URLs (nats-route://host:port).
	Routes []string
}

// RunServer starts an embedded NATS server with JetStream on file storage and
// waits until it accepts connections.
func RunServer(cfg ServerConfig) (*server.Server, error) {
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	opts := &server.Options{
		ServerName: "allot-embedded",
		Host:       host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: 1 << 20,
	}
	if c := cfg.Cluster; c.Name != "" {
		opts.ServerName = c.ServerName
		opts.Cluster = server.ClusterOpts{Name: c.Name, Host: c.Host, Port: c.Port}
		opts.Routes = server.RoutesFromStr(strings.Join(c.Routes, ","))
	}
	if cfg.SyncInterval <= 0 {
		opts.SyncAlways = true
		opts.SyncInterval = 2 * time.Minute // unused when SyncAlways
	} else {
		opts.SyncInterval = cfg.SyncInterval
	}
	// The server reports a taken port only by never becoming ready; a
	// trial listen says so at once.
	for _, p := range []struct {
		what, host string
		port       int
	}{{"client", host, cfg.Port}, {"route", cmp.Or(cfg.Cluster.Host, host), cfg.Cluster.Port}} {
		if p.port <= 0 || (p.what == "route" && cfg.Cluster.Name == "") {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(p.host, strconv.Itoa(p.port)))
		if err != nil {
			return nil, fmt.Errorf("embedded nats: the %s port %d is taken: %w", p.what, p.port, err)
		}
		ln.Close()
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	// It listens once JetStream has recovered its store, which after a
	// crash may take a while on a busy machine.
	if !s.ReadyForConnections(readyWait) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats: not accepting connections after %s, still recovering its store in %s?", readyWait, cfg.StoreDir)
	}
	return s, nil
}

// readyWait is how long RunServer waits for the server to listen.
const readyWait = 2 * time.Minute
