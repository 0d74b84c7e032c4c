package ingest

import (
	"cmp"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/ingest/publish"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/wire"
)

// Config is ingest's configuration, read from ALLOT_ variables (embed it in
// the binary's envconfig struct). It is the only one: defaults live in its
// tags (config.Defaults[Config] for tests and launchers), Validate checks
// it once, and Run, New and the components take it as it is; values
// derived from it are its methods. cmd/ingest and the `make run` launcher
// share it, so the two cannot drift apart.
type Config struct {
	HTTPAddr        string        `envconfig:"HTTP_ADDR" default:":8080" desc:"HTTP listen address"`
	IDSecret        string        `envconfig:"ID_SECRET" desc:"key of the request-id checksum; the same on every ingest instance; empty = built-in default"`
	ShutdownTimeout time.Duration `envconfig:"INGEST_SHUTDOWN_TIMEOUT" default:"15s" desc:"bound on the graceful shutdown"`
	Partitions      int           `envconfig:"PARTITIONS" default:"1" desc:"partitions of the request stream, fixed when it is created; checked at start"`
	Shed            bool          `envconfig:"SHED" default:"true" desc:"answer a claim for a full activity as soon as the request stream proves its answer, before the allocator applies it"`
	ActivityCache   int           `envconfig:"INGEST_ACTIVITY_CACHE" default:"100000" desc:"activities whose view and last change ingest keeps for shedding (LRU)"`
	MaxWaiters      int           `envconfig:"INGEST_MAX_WAITERS" default:"10000" desc:"handlers waiting for a result (?wait=); beyond, ?wait= is ignored (answered at once)"`
	MetricsAddr     string        `envconfig:"INGEST_METRICS_ADDR" desc:"serve /metrics also on a listener of its own, without a token (e.g. :9092); empty = only on the API listener"`
	Publishing
	Limits
	access.AuthConfig
}

// Publishing is how requests are published (package publish).
type Publishing struct {
	PublishTimeout time.Duration `envconfig:"INGEST_PUBLISH_TIMEOUT" default:"5s" desc:"bound on one publish to JetStream, PubAck included"`
	CommitMinBatch int           `envconfig:"INGEST_COMMIT_MIN_BATCH" default:"16" desc:"fewest messages of a group commit published as one atomic batch; -1 = never"`
	BatchMax       int           `envconfig:"INGEST_BATCH_MAX" default:"1000" desc:"most requests of one activity published as one message (a batch) by the group commit; 1 = every request alone"`
	MaxInFlight    int           `envconfig:"INGEST_MAX_IN_FLIGHT" default:"2048" desc:"publishes awaiting their PubAck; 503 beyond"`
}

// Limits are the rate limits and the client addresses they count
// (package access).
type Limits struct {
	UserRate       float64 `envconfig:"INGEST_USER_RATE" default:"20" desc:"writes per second per user, 429 beyond; 0 = off"`
	RateLimit      float64 `envconfig:"INGEST_RATE_LIMIT" default:"0" desc:"accepted writes per second of this instance, 429 beyond; 0 = off"`
	OpenRate       float64 `envconfig:"INGEST_OPEN_RATE" default:"50" desc:"opens and resizes per second of this instance, 429 beyond; -1 = no cap"`
	BadAuthRate    float64 `envconfig:"INGEST_BAD_AUTH_RATE" default:"5" desc:"requests per second per client address that fail authentication (burst 50), 429 beyond for the failing ones (a valid token is never refused); -1 = no limit"`
	ReadRate       float64 `envconfig:"INGEST_READ_RATE" default:"50" desc:"activity and signup reads per second per token subject (burst twice that), 429 beyond; allot:admin tokens are not limited; without authentication, signup reads per path user; 0 = off"`
	TrustedProxies string  `envconfig:"TRUSTED_PROXIES" desc:"comma-separated CIDR prefixes of proxies whose X-Forwarded-For names the client address; empty = the peer address counts"`
}

// Validate reports the first invalid value as one sentence.
func (e Config) Validate() error {
	if _, _, err := net.SplitHostPort(e.HTTPAddr); err != nil {
		return fmt.Errorf("ALLOT_HTTP_ADDR must be host:port or :port, got %q", e.HTTPAddr)
	}
	if e.PublishTimeout <= 0 || e.PublishTimeout > time.Minute {
		return fmt.Errorf("ALLOT_INGEST_PUBLISH_TIMEOUT must be between 0 and 1m, got %s", e.PublishTimeout)
	}
	if e.ShutdownTimeout <= 0 {
		return fmt.Errorf("ALLOT_INGEST_SHUTDOWN_TIMEOUT must be positive, got %s", e.ShutdownTimeout)
	}
	if e.MaxInFlight < 1 || e.MaxInFlight > 4000 {
		return fmt.Errorf("ALLOT_INGEST_MAX_IN_FLIGHT must be between 1 and 4000, got %d", e.MaxInFlight)
	}
	if e.Partitions < 1 || e.Partitions > 1024 {
		return fmt.Errorf("ALLOT_PARTITIONS must be between 1 and 1024, got %d", e.Partitions)
	}
	if e.UserRate < 0 {
		return fmt.Errorf("ALLOT_INGEST_USER_RATE must not be negative, got %g", e.UserRate)
	}
	if e.ReadRate < 0 {
		return fmt.Errorf("ALLOT_INGEST_READ_RATE must not be negative, got %g", e.ReadRate)
	}
	if _, err := access.ParseTrustedProxies(e.TrustedProxies); err != nil {
		return err
	}
	if e.RateLimit < 0 {
		return fmt.Errorf("ALLOT_INGEST_RATE_LIMIT must not be negative, got %g", e.RateLimit)
	}
	if e.ActivityCache < 1 || e.ActivityCache > 100_000_000 {
		return fmt.Errorf("ALLOT_INGEST_ACTIVITY_CACHE must be between 1 and 100000000, got %d", e.ActivityCache)
	}
	if e.MaxWaiters < 1 {
		return fmt.Errorf("ALLOT_INGEST_MAX_WAITERS must be positive, got %d", e.MaxWaiters)
	}
	if e.OpenRate <= 0 && e.OpenRate != -1 {
		return fmt.Errorf("ALLOT_INGEST_OPEN_RATE must be positive, or -1 for no cap, got %g", e.OpenRate)
	}
	if e.CommitMinBatch == 0 || e.CommitMinBatch < -1 || e.CommitMinBatch > publish.DefaultCommitMaxBatch {
		return fmt.Errorf("ALLOT_INGEST_COMMIT_MIN_BATCH must be -1 (never batch) or between 1 and %d, got %d", publish.DefaultCommitMaxBatch, e.CommitMinBatch)
	}
	if e.BatchMax < 1 || e.BatchMax > wire.MaxBatch {
		return fmt.Errorf("ALLOT_INGEST_BATCH_MAX must be between 1 (no batches) and %d, got %d", wire.MaxBatch, e.BatchMax)
	}
	if e.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(e.MetricsAddr); err != nil {
			return fmt.Errorf("ALLOT_INGEST_METRICS_ADDR must be host:port or :port, got %q", e.MetricsAddr)
		}
	}
	if e.BadAuthRate <= 0 && e.BadAuthRate != -1 {
		return fmt.Errorf("ALLOT_INGEST_BAD_AUTH_RATE must be positive, or -1 for no limit, got %g", e.BadAuthRate)
	}
	return e.AuthConfig.Validate(e.HTTPAddr)
}

// RateBurst is the burst of RateLimit: a tenth of a second's writes, at
// least one.
func (e Config) RateBurst() int { return max(1, int(e.RateLimit/10)) }

// UserBurst is the burst of UserRate: two seconds' writes, at least one.
func (e Config) UserBurst() int { return max(1, int(2*e.UserRate)) }

// ReadBurst is the burst of ReadRate: two seconds' reads, at least one.
func (e Config) ReadBurst() int { return max(1, int(2*e.ReadRate)) }

// Proxies is TrustedProxies parsed (Validate refused a bad list).
func (e Config) Proxies() []netip.Prefix {
	p, _ := access.ParseTrustedProxies(e.TrustedProxies)
	return p
}

// WriteTimeout is the HTTP server's: a response may take up to MaxWait
// plus a publish and a read.
func (e Config) WriteTimeout() time.Duration {
	return MaxWait + e.PublishTimeout + DefaultQueryTimeout + 10*time.Second
}

func (e Config) accessConfig(t TestHooks) access.Config {
	return access.Config{
		RateLimit: e.RateLimit, RateBurst: e.RateBurst(),
		UserRate: e.UserRate, UserBurst: cmp.Or(t.UserBurst, e.UserBurst()),
		OpenRate: e.OpenRate, BadAuthRate: e.BadAuthRate,
		ReadRate: e.ReadRate, ReadBurst: cmp.Or(t.ReadBurst, e.ReadBurst()),
		TrustedProxies: e.Proxies(),
	}
}

func (e Config) publishConfig(t TestHooks) publish.Config {
	return publish.Config{PublishTimeout: e.PublishTimeout, MaxInFlight: e.MaxInFlight,
		CommitMinBatch: e.CommitMinBatch, BatchMax: e.BatchMax,
		SettleMax: cmp.Or(t.SettleMax, publish.DefaultSettleMax), DropBatchAck: t.DropBatchAck}
}

// Deps is everything Run and New use that is not configuration.
type Deps struct {
	// DB is the one database read (results, activities, signups) when
	// Shards is nil; read only, the caller's to close.
	DB *sql.DB
	// Shards, when set, are the pools of ALLOT_MYSQL_SHARDS by shard name
	// (DB is then ignored): each read goes to the shard the map
	// (bucket ALLOT_SHARDS) names for its partition. Read only, the
	// caller's to close.
	Shards shards.Pools
	NATS   *nats.Conn // the caller's to drain
	// JS is the JetStream handle over NATS; nil: New makes one.
	JS  jetstream.JetStream
	Log *slog.Logger // nil: discard
	// Registry receives ingest's metrics. When nil, Run creates one with
	// the Go and process collectors and New a bare one. A launcher running
	// several parts in one process passes its shared registry.
	Registry prometheus.Registerer
	// Gatherer is what /metrics serves; nil: Registry, which must then be
	// a Gatherer (a *prometheus.Registry is).
	Gatherer prometheus.Gatherer
	// Verifier, when set, verifies bearer tokens instead of one Run builds
	// from Config (tests, launchers); New serves without authentication
	// when it is nil.
	Verifier *auth.Verifier
	// Listener, when set, is served instead of listening on HTTPAddr, and
	// MetricsListener instead of one on MetricsAddr (tests and launchers
	// that pick a free port). Run closes them.
	Listener, MetricsListener net.Listener
	// Test holds the test-only seams.
	Test TestHooks
}

// TestHooks are bounds only tests change: only tests set it; the zero value
// is production (each zero field takes the constant named beside it).
type TestHooks struct {
	RecheckInterval time.Duration // DefaultRecheckInterval
	QueryTimeout    time.Duration // DefaultQueryTimeout
	ShedWait        time.Duration // shed.DefaultWait
	SettleMax       int           // publish.DefaultSettleMax
	UserBurst       int           // Config.UserBurst
	ReadBurst       int           // Config.ReadBurst
	// DropBatchAck, when set, is asked for every PubAck of a batch message
	// the group commit receives; true drops it as if it were lost (nil:
	// none is dropped).
	DropBatchAck func(id string) bool
}

func (t TestHooks) recheck() time.Duration { return cmp.Or(t.RecheckInterval, DefaultRecheckInterval) }

func (t TestHooks) queryTimeout() time.Duration { return cmp.Or(t.QueryTimeout, DefaultQueryTimeout) }
