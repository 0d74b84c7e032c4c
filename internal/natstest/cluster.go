package natstest

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/allot-dev/allot/internal/bus"
)

// Cluster is a JetStream cluster of embedded servers on loopback ports,
// each with its own store directory, for tests of replicated streams.
type Cluster struct {
	Servers []*server.Server
}

// NewCluster starts n clustered servers for t and shuts them down when t
// ends. The servers accept connections when it returns; the JetStream meta
// leader may still be in election, as on a cluster that has just formed.
func NewCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	routes := make([]int, n)
	for i := range routes {
		routes[i] = freePort(t)
	}
	var urls []string
	for _, p := range routes {
		urls = append(urls, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	c := &Cluster{}
	for i := range n {
		s, err := bus.RunServer(bus.ServerConfig{
			Port: -1, StoreDir: t.TempDir(), SyncInterval: time.Second,
			Cluster: bus.ClusterConfig{
				Name: "allot-test", ServerName: fmt.Sprintf("n%d", i+1),
				Host: "127.0.0.1", Port: routes[i], Routes: urls,
			},
		})
		if err != nil {
			t.Fatalf("natstest: cluster node %d: %v", i+1, err)
		}
		c.Servers = append(c.Servers, s)
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
	return c
}

// URL is every node's client URL, comma-separated, as ALLOT_NATS_URL takes it.
func (c *Cluster) URL() string {
	var urls []string
	for _, s := range c.Servers {
		urls = append(urls, s.ClientURL())
	}
	return strings.Join(urls, ",")
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
