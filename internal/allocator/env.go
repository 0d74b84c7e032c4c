package allocator

import (
	"fmt"
	"time"
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
			CheckpointInterval: checkpointInterval(e.CheckpointInterval)},
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
