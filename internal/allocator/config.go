package allocator

import (
	"cmp"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocator/pools"
	"github.com/allot-dev/allot/internal/shards"
)

// Config is the allocator's configuration, read from ALLOT_ variables
// (embed it in the binary's envconfig struct). Its defaults live in the
// tags only: a launcher or a test starts from config.Defaults[Config]()
// and sets fields. Run and New take it as it is, checked by Validate.
type Config struct {
	Partitions         int           `envconfig:"PARTITIONS" default:"1" desc:"partitions of the request stream, fixed when it is created"`
	PinnedTTL          time.Duration `envconfig:"PINNED_TTL" default:"5s" desc:"failover time: how long a partition stays pinned to an allocator that stopped pulling"`
	BatchSize          int           `envconfig:"BATCH_SIZE" default:"10000" desc:"most requests per allocator transaction"`
	BatchWait          time.Duration `envconfig:"BATCH_WAIT" default:"2ms" desc:"how long a batch waits for more requests"`
	MetricsAddr        string        `envconfig:"METRICS_ADDR" default:":9091" desc:"allocator /metrics, /healthz and /readyz; empty = off"`
	CheckpointInterval time.Duration `envconfig:"CHECKPOINT_INTERVAL" default:"6h" desc:"how often each partition's state is checkpointed for audit -from-checkpoint; 0 = never"`
	Cache              int           `envconfig:"ALLOCATOR_CACHE_ACTIVITIES" default:"10000" desc:"activities whose live state each partition's allocator keeps between batches (LRU); the rest is reloaded from MySQL"`
	StallTimeout       time.Duration `envconfig:"STALL_TIMEOUT" default:"15s" desc:"an allocator that cannot commit for this long while requests of its partition wait gives the partition up to a peer; 0 = never"`
}

// Validate reports the first invalid value as one sentence.
func (c Config) Validate() error {
	if c.Partitions < 1 || c.Partitions > 1024 {
		return fmt.Errorf("ALLOT_PARTITIONS must be between 1 and 1024, got %d", c.Partitions)
	}
	if c.PinnedTTL < time.Second {
		return fmt.Errorf("ALLOT_PINNED_TTL must be at least 1s, got %s", c.PinnedTTL)
	}
	if c.BatchSize < 1 || c.BatchSize > 10_000 {
		return fmt.Errorf("ALLOT_BATCH_SIZE must be between 1 and 10000, got %d", c.BatchSize)
	}
	if c.Cache < 1 || c.Cache > 10_000_000 {
		return fmt.Errorf("ALLOT_ALLOCATOR_CACHE_ACTIVITIES must be between 1 and 10000000, got %d", c.Cache)
	}
	if c.BatchWait < 0 || c.BatchWait > time.Second {
		return fmt.Errorf("ALLOT_BATCH_WAIT must be between 0 and 1s, got %s", c.BatchWait)
	}
	if c.StallTimeout != 0 && (c.StallTimeout < time.Second || c.StallTimeout > time.Hour) {
		return fmt.Errorf("ALLOT_STALL_TIMEOUT must be 0 (never) or between 1s and 1h, got %s", c.StallTimeout)
	}
	if c.CheckpointInterval < 0 {
		return fmt.Errorf("ALLOT_CHECKPOINT_INTERVAL must not be negative, got %s", c.CheckpointInterval)
	}
	return nil
}

// checkpoints reports whether the partition's state is checkpointed.
func (c Config) checkpoints() bool { return c.CheckpointInterval > 0 }

// stallWatched reports whether an allocator gives its partition up after
// StallTimeout without a commit.
func (c Config) stallWatched() bool { return c.StallTimeout > 0 }

// SessionDSN is dsn for the allocator's pool: its sessions end on the
// server's side once idle for ALLOT_STALL_TIMEOUT (wait_timeout, unless dsn
// sets one). An allocator's session is never idle inside a transaction
// but for a lost route, and such a session keeps the partition's fence row
// locked: without the limit the server keeps it, and the lock, until TCP
// gives up (hours), and no peer can take the partition over.
func (c Config) SessionDSN(dsn string) (string, error) {
	return sessionDSN(dsn, c.StallTimeout)
}

func sessionDSN(dsn string, idle time.Duration) (string, error) { return pools.SessionDSN(dsn, idle) }

// Deps is everything Run and New need that is not configuration.
type Deps struct {
	// DB is the pool of Partition's shard (Run sets it from Shards).
	DB *sql.DB
	// Shards are Run's pools by shard name (ALLOT_MYSQL_SHARDS); nil: DB
	// is the one shard, shards.DefaultName. Run migrates each and applies
	// each partition on the shard the map names.
	Shards shards.Pools
	// Tenure is Partition's epoch on DB's shard, from the map (Run sets
	// it); nil: epoch 1, never moved.
	Tenure *shards.Tenure
	NATS   *nats.Conn
	Log    *slog.Logger
	// Registerer takes New's metrics (nil: a registry of its own). Run
	// serves a registry of its own and ignores it.
	Registerer prometheus.Registerer
	// MetricsListener, when set, is where Run serves /metrics, /healthz
	// and /readyz, already open; else Run listens on Config.MetricsAddr.
	MetricsListener net.Listener
	// Partition is the partition New's allocator applies, one of
	// Config.Partitions (Run sets it for each).
	Partition int
	// Prefers, when set, says whether this process should pull on a
	// partition (the membership's answer); nil pulls on every partition.
	Prefers func(partition int) bool
	// OnStall, when set, is told when the allocator gives its partition up
	// (stalled true) and when it can commit again (false): Run tells the
	// membership, so that peers take the partition.
	OnStall func(partition int, stalled bool)
	// Test holds the seams tests use. Only tests set it; its zero value is
	// production.
	Test TestHooks
}

// TestHooks let tests stop the allocator at the points where a real
// process can die, and shorten its fixed timings. The zero value is
// production: every hook nil, every timing its production value.
type TestHooks struct {
	// AfterCommit runs after a batch commits and before its messages are
	// acknowledged. A non-nil error makes the allocator stop right there, as
	// if the process had been killed between commit and ack.
	AfterCommit func() error
	// BeforeConfirm runs in the post-commit goroutine before it confirms a
	// batch's acks: a slow broker round trip, for tests of the ordering.
	BeforeConfirm func()
	// Stopping runs when Stop begins: a slow drain, for tests of shutdown.
	Stopping func()
	// ViewSnapshot runs inside a view rebuild's MySQL snapshot, between
	// its read of the activity rows and of the signups.
	ViewSnapshot func()
	// AwaitingAcks runs while a relay pass's publishes await their PubAcks.
	AwaitingAcks func()
	// AckWait is the consumer's redelivery timeout (0: 30s); RelayPeriod
	// how often the outbox relay passes unwoken (0: 1s).
	AckWait, RelayPeriod time.Duration
	// IdleCheck is how often an idle allocator looks for a gap between its
	// fence and the stream (0: 1s), which a crashed peer leaves behind.
	IdleCheck time.Duration
	// ViewClearTTL is how long a cleared view stays in the view bucket
	// (0: viewpub.DefaultClearTTL).
	ViewClearTTL time.Duration
	// PieceBytes bounds a piece of a long promoted or event list in MySQL
	// (0: derived from the server's max_allowed_packet).
	PieceBytes int
	// BucketSize bounds the waiters of a waitlist bucket (0: waitlist.BucketSize).
	BucketSize int64
	// ShardTried runs after each try of a shard that did not answer.
	ShardTried func(shard string)
}

// ackWait and idleCheck are the timings tests may shorten.
func (h TestHooks) ackWait() time.Duration   { return cmp.Or(h.AckWait, 30*time.Second) }
func (h TestHooks) idleCheck() time.Duration { return cmp.Or(h.IdleCheck, time.Second) }
