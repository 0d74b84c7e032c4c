package allocator

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Env is the allocator's part of a binary's configuration, read from
// ALLOT_ variables (embed it in the binary's envconfig struct).
// cmd/allocator and the `make run` launcher share it.
type Env struct {
	Partitions         int           `envconfig:"PARTITIONS" default:"1" desc:"partitions of the request stream, fixed when it is created"`
	PinnedTTL          time.Duration `envconfig:"PINNED_TTL" default:"5s" desc:"failover time: how long a partition stays pinned to an allocator that stopped pulling"`
	BatchSize          int           `envconfig:"BATCH_SIZE" default:"2000" desc:"most requests per allocator transaction"`
	BatchWait          time.Duration `envconfig:"BATCH_WAIT" default:"2ms" desc:"how long a batch waits for more requests"`
	MetricsAddr        string        `envconfig:"METRICS_ADDR" default:":9091" desc:"allocator /metrics, /healthz and /readyz; empty = off"`
	CheckpointInterval time.Duration `envconfig:"CHECKPOINT_INTERVAL" default:"6h" desc:"how often each partition's state is checkpointed for audit -from-checkpoint; 0 = never"`
	Cache              int           `envconfig:"ALLOCATOR_CACHE_ACTIVITIES" default:"10000" desc:"activities whose live state each partition's allocator keeps between batches (LRU); the rest is reloaded from MySQL"`
	StallTimeout       time.Duration `envconfig:"STALL_TIMEOUT" default:"15s" desc:"an allocator that cannot commit for this long while requests of its partition wait gives the partition up to a peer; 0 = never"`
}

// Validate reports the first invalid value as one sentence.
func (e Env) Validate() error {
	if e.Partitions < 1 || e.Partitions > 1024 {
		return fmt.Errorf("ALLOT_PARTITIONS must be between 1 and 1024, got %d", e.Partitions)
	}
	if e.PinnedTTL < time.Second {
		return fmt.Errorf("ALLOT_PINNED_TTL must be at least 1s, got %s", e.PinnedTTL)
	}
	if e.BatchSize < 1 || e.BatchSize > 10_000 {
		return fmt.Errorf("ALLOT_BATCH_SIZE must be between 1 and 10000, got %d", e.BatchSize)
	}
	if e.Cache < 1 || e.Cache > 10_000_000 {
		return fmt.Errorf("ALLOT_ALLOCATOR_CACHE_ACTIVITIES must be between 1 and 10000000, got %d", e.Cache)
	}
	if e.BatchWait < 0 || e.BatchWait > time.Second {
		return fmt.Errorf("ALLOT_BATCH_WAIT must be between 0 and 1s, got %s", e.BatchWait)
	}
	if e.StallTimeout != 0 && (e.StallTimeout < time.Second || e.StallTimeout > time.Hour) {
		return fmt.Errorf("ALLOT_STALL_TIMEOUT must be 0 (never) or between 1s and 1h, got %s", e.StallTimeout)
	}
	if e.CheckpointInterval < 0 {
		return fmt.Errorf("ALLOT_CHECKPOINT_INTERVAL must not be negative, got %s", e.CheckpointInterval)
	}
	return nil
}

// RunConfig turns the settings into what Run takes.
func (e Env) RunConfig() RunConfig {
	return RunConfig{
		Config: Config{Partitions: e.Partitions, PinnedTTL: e.PinnedTTL, BatchSize: e.BatchSize, BatchWait: e.BatchWait,
			CacheActivities:    e.Cache,
			CheckpointInterval: checkpointInterval(e.CheckpointInterval), StallTimeout: stallTimeout(e.StallTimeout)},
		MetricsAddr: e.MetricsAddr,
	}
}

// checkpointInterval maps ALLOT_CHECKPOINT_INTERVAL (0 = never) to
// Config.CheckpointInterval (0 = the default, negative = never).
func checkpointInterval(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// stallTimeout maps ALLOT_STALL_TIMEOUT (0 = never) to
// Config.StallTimeout (0 = the default, negative = never).
func stallTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// SessionDSN is dsn for the allocator's pool: its sessions end on the
// server's side once idle for ALLOT_STALL_TIMEOUT (wait_timeout, unless dsn
// sets one). An allocator's session is never idle inside a transaction
// but for a lost route, and such a session keeps the partition's fence row
// locked: without the limit the server keeps it, and the lock, until TCP
// gives up (hours), and no peer can take the partition over.
func (e Env) SessionDSN(dsn string) (string, error) {
	return sessionDSN(dsn, e.StallTimeout)
}

func sessionDSN(dsn string, idle time.Duration) (string, error) {
	if idle <= 0 {
		return dsn, nil
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("parse mysql dsn: %w", err)
	}
	if _, set := cfg.Params["wait_timeout"]; set {
		return dsn, nil
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["wait_timeout"] = strconv.Itoa(int(math.Ceil(idle.Seconds())))
	return cfg.FormatDSN(), nil
}
