package ingest

import (
	"fmt"
	"net"
	"time"
)

// Env is ingest's part of a binary's configuration, read from ALLOT_
// variables (embed it in the binary's envconfig struct). cmd/ingest and
// the `make run` launcher share it, so the two cannot drift apart.
type Env struct {
	HTTPAddr        string        `envconfig:"HTTP_ADDR" default:":8080" desc:"HTTP listen address"`
	IDSecret        string        `envconfig:"ID_SECRET" desc:"key of the request-id checksum; the same on every ingest instance; empty = built-in default"`
	PublishTimeout  time.Duration `envconfig:"INGEST_PUBLISH_TIMEOUT" default:"5s" desc:"bound on one publish to JetStream, PubAck included"`
	ShutdownTimeout time.Duration `envconfig:"INGEST_SHUTDOWN_TIMEOUT" default:"15s" desc:"bound on the graceful shutdown"`
	UserRate        float64       `envconfig:"INGEST_USER_RATE" default:"20" desc:"writes per second per user, 429 beyond; 0 = off"`
	RateLimit       float64       `envconfig:"INGEST_RATE_LIMIT" default:"0" desc:"accepted writes per second of this instance, 429 beyond; 0 = off"`
	Partitions      int           `envconfig:"PARTITIONS" default:"1" desc:"partitions of the request stream, fixed when it is created; checked at start"`
	Shed            bool          `envconfig:"SHED" default:"true" desc:"answer a claim for a full activity as soon as the request stream proves its answer, before the allocator applies it"`
	ActivityCache   int           `envconfig:"INGEST_ACTIVITY_CACHE" default:"100000" desc:"activities whose view and last change ingest keeps for early answers (LRU)"`
	MaxWaiters      int           `envconfig:"INGEST_MAX_WAITERS" default:"10000" desc:"handlers waiting for a result (?wait=); beyond, ?wait= is ignored (answered at once)"`
	OpenRate        float64       `envconfig:"INGEST_OPEN_RATE" default:"50" desc:"opens and resizes per second of this instance, 429 beyond; -1 = no cap"`
	CommitMinBatch  int           `envconfig:"INGEST_COMMIT_MIN_BATCH" default:"16" desc:"smallest queue of requests published as one atomic batch (group commit); -1 = never"`
	MaxInFlight     int           `envconfig:"INGEST_MAX_IN_FLIGHT" default:"2048" desc:"publishes awaiting their PubAck; 503 beyond"`
	MetricsAddr     string        `envconfig:"INGEST_METRICS_ADDR" desc:"serve /metrics also on a listener of its own, without a token (e.g. :9092); empty = only on the API listener"`
	BadAuthRate     float64       `envconfig:"INGEST_BAD_AUTH_RATE" default:"5" desc:"requests per second per client address that fail authentication (burst 50), 429 beyond for the failing ones (a valid token is never refused); -1 = no limit"`
	ReadRate        float64       `envconfig:"INGEST_READ_RATE" default:"50" desc:"activity and signup reads per second per token subject (burst twice that), 429 beyond; allot:admin tokens are not limited; without authentication, signup reads per path user; 0 = off"`
	TrustedProxies  string        `envconfig:"TRUSTED_PROXIES" desc:"comma-separated CIDR prefixes of proxies whose X-Forwarded-For names the client address; empty = the peer address counts"`
	AuthEnv
}

// Validate reports the first invalid value as one sentence.
func (e Env) Validate() error {
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
	if _, err := ParseTrustedProxies(e.TrustedProxies); err != nil {
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
	if e.CommitMinBatch == 0 || e.CommitMinBatch < -1 || e.CommitMinBatch > DefaultCommitMaxBatch {
		return fmt.Errorf("ALLOT_INGEST_COMMIT_MIN_BATCH must be -1 (never batch) or between 1 and %d, got %d", DefaultCommitMaxBatch, e.CommitMinBatch)
	}
	if e.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(e.MetricsAddr); err != nil {
			return fmt.Errorf("ALLOT_INGEST_METRICS_ADDR must be host:port or :port, got %q", e.MetricsAddr)
		}
	}
	if e.BadAuthRate <= 0 && e.BadAuthRate != -1 {
		return fmt.Errorf("ALLOT_INGEST_BAD_AUTH_RATE must be positive, or -1 for no limit, got %g", e.BadAuthRate)
	}
	return e.AuthEnv.Validate(e.HTTPAddr)
}

// RunConfig turns the settings into what Run takes.
func (e Env) RunConfig() RunConfig {
	trusted, _ := ParseTrustedProxies(e.TrustedProxies) // Validate refused a bad list
	return RunConfig{
		HTTPAddr: e.HTTPAddr,
		Options: Options{
			IDSecret:       e.IDSecret,
			PublishTimeout: e.PublishTimeout,
			RateLimit:      e.RateLimit,
			UserRate:       e.UserRate,
			DisableShed:    !e.Shed,
			Partitions:     e.Partitions,
			MaxInFlight:    e.MaxInFlight,
			CommitMinBatch: e.CommitMinBatch,
			ActivityCache:  e.ActivityCache,
			MaxWaiters:     e.MaxWaiters,
			OpenRate:       e.OpenRate,
			BadAuthRate:    e.BadAuthRate,
			ReadRate:       e.ReadRate,
			TrustedProxies: trusted,
		},
		ShutdownTimeout: e.ShutdownTimeout,
		MetricsAddr:     e.MetricsAddr,
		Auth:            e.AuthEnv.Config(),
		AuthOff:         e.AuthEnv.Off(),
	}
}
