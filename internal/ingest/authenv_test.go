package ingest

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/natstest"
)

// TestRunRefusesOpenNonLoopback: Run itself refuses a listener that is not
// loopback when no key is set, before serving anything.
func TestRunRefusesOpenNonLoopback(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ns := natstest.New(t)
	ns.Setup(t, config.Defaults[bus.Config]())
	nc, _ := ns.Connect(t)
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = Run(ctx, testConfig(), Deps{DB: db.DB, NATS: nc, Listener: ln, Registry: prometheus.NewRegistry()})
	if err == nil || !strings.Contains(err.Error(), "without authentication") {
		t.Fatalf("Run on 0.0.0.0 without a key = %v, want a refusal", err)
	}
}

// TestRunClosesListenersWhenItRefuses: the listeners handed to Run are
// closed when it returns before serving them (here: a refused open
// listener, and a key too short), so that nothing keeps their ports.
func TestRunClosesListenersWhenItRefuses(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ns := natstest.New(t)
	ns.Setup(t, config.Defaults[bus.Config]())
	nc, _ := ns.Connect(t)
	for _, c := range []struct {
		name, host string
		auth       access.AuthConfig
		want       string
	}{
		{"open on 0.0.0.0", "0.0.0.0", access.AuthConfig{}, "without authentication"},
		{"a short key", "127.0.0.1", access.AuthConfig{HS256Key: "short"}, "at least"},
	} {
		listen := func() (net.Listener, string) {
			l, err := net.Listen("tcp", c.host+":0")
			if err != nil {
				t.Fatal(err)
			}
			return l, "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		}
		ln, api := listen()
		mln, metrics := listen()
		cfg := testConfig()
		cfg.AuthConfig = c.auth
		err := Run(context.Background(), cfg, Deps{DB: db.DB, NATS: nc, Listener: ln, MetricsListener: mln,
			Registry: prometheus.NewRegistry()})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: Run = %v, want an error containing %q", c.name, err, c.want)
		}
		for what, addr := range map[string]string{"API": api, "metrics": metrics} {
			if conn, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
				conn.Close()
				t.Errorf("%s: the %s listener still accepts connections after Run returned", c.name, what)
			}
		}
	}
}

// TestRunMetricsListener: with authentication on, /metrics on the API
// listener needs allot:operator, and ALLOT_INGEST_METRICS_ADDR serves it
// on a listener of its own without a token.
func TestRunMetricsListener(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ns := natstest.New(t)
	ns.Setup(t, config.Defaults[bus.Config]())
	nc, _ := ns.Connect(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := mln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		cfg := testConfig()
		cfg.ShutdownTimeout, cfg.HS256Key = 5*time.Second, testKey
		ran <- Run(ctx, cfg, Deps{DB: db.DB, NATS: nc, Listener: ln, MetricsListener: mln, Registry: prometheus.NewRegistry()})
	}()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	get := func(url, tok string) int {
		c, _ := statusOf(http.MethodGet, url, tok)
		return c
	}
	api := "http://" + ln.Addr().String()
	eventually(t, 20*time.Second, "Run serves /readyz", func() bool { return get(api+"/readyz", "") == http.StatusOK })
	op := signHS(t, testKey, jwt.MapClaims{"sub": "ops", "scope": auth.ScopeOperator, "exp": time.Now().Add(time.Hour).Unix()})
	for _, c := range []struct {
		what, url, tok string
		want           int
	}{
		{"API /metrics without a token", api + "/metrics", "", http.StatusUnauthorized},
		{"API /metrics with allot:operator", api + "/metrics", op, http.StatusOK},
		{"metrics listener without a token", "http://" + metricsAddr + "/metrics", "", http.StatusOK},
	} {
		if got := get(c.url, c.tok); got != c.want {
			t.Errorf("%s: %d, want %d", c.what, got, c.want)
		}
	}
}
