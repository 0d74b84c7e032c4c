package audit

import (
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/shards"
)

// Config narrows an audit: what cmd/audit's flags set (-activity,
// -from-seq, -from-time, -from-checkpoint); no ALLOT_ variable sets it
// (cmd/audit embeds it next to config.Common). The zero value, which is
// also config.Defaults[audit.Config](), audits every activity over the
// whole stream. Validate checks it once, before Run.
type Config struct {
	// Activities, when non-empty, limits the audit to these activity ids.
	Activities []int64 `ignored:"true"`
	// Partitions, when non-empty, limits the audit to the activities (and
	// the voids) of these partitions of the request stream: their
	// messages, results, refusals, fences and checkpoints. Rows of other
	// partitions in the database are left alone (a database that holds
	// several partitions' state). With Activities, both apply.
	Partitions []int `ignored:"true"`
	// FromSeq, when non-zero, compares only from this stream sequence on.
	FromSeq uint64 `ignored:"true"`
	// FromTime, when non-zero, compares only from the first message stored
	// at or after it. Exclusive with FromSeq.
	FromTime time.Time `ignored:"true"`
	// FromCheckpoint starts from each partition's oldest checkpoint the
	// request stream still reaches back to, instead of from sequence 1: the
	// checkpoint's state is checked against its digest and the requests
	// after it are replayed and compared. It is how an audit runs once
	// retention has removed older requests. Exclusive with FromSeq and
	// FromTime.
	FromCheckpoint bool `ignored:"true"`
}

// ErrInvalidConfig is what Config.Validate's errors are (errors.Is): a
// Config an audit cannot honour.
var ErrInvalidConfig = errors.New("audit: invalid configuration")

// configError is one of Validate's sentences, named after the flag.
type configError string

func (e configError) Error() string        { return string(e) }
func (e configError) Is(target error) bool { return target == ErrInvalidConfig }

// Validate reports the first value an audit cannot honour as one sentence.
func (c Config) Validate() error {
	if c.FromCheckpoint && (c.FromSeq > 0 || !c.FromTime.IsZero()) {
		return configError("-from-checkpoint excludes -from-seq and -from-time: give one")
	}
	if c.FromSeq > 0 && !c.FromTime.IsZero() {
		return configError("-from-seq and -from-time exclude each other: give one")
	}
	if c.FromSeq == math.MaxUint64 {
		return configError(fmt.Sprintf("-from-seq: %d is out of range", c.FromSeq))
	}
	for _, p := range c.Partitions {
		if p < 0 {
			return configError(fmt.Sprintf("partition %d is not a partition: partitions are numbered from 0", p))
		}
	}
	for _, id := range c.Activities {
		if id <= 0 {
			return configError(fmt.Sprintf("-activity: %q is not a positive activity id", strconv.FormatInt(id, 10)))
		}
	}
	return nil
}

// activities is Activities in ascending order, each once.
func (c Config) activities() []int64 {
	ids := slices.Clone(c.Activities)
	slices.Sort(ids)
	return slices.Compact(ids)
}

// Deps is what an audit reads and writes besides its Config.
type Deps struct {
	// DB is the MySQL database the allocator writes, when there is one
	// (Shards nil): the audit checks it alone, without the shard map.
	DB *sql.DB
	// Shards, when set, are the open pools of ALLOT_MYSQL_SHARDS by name:
	// the audit reads the partition → shard map (bucket ALLOT_SHARDS) and
	// checks each shard's partitions there, and every shard for rows of
	// partitions it does not own. With one shard that the map (or its
	// absence) gives every partition, it is the audit of DB.
	Shards shards.Pools
	// Unreachable are the shards of ALLOT_MYSQL_SHARDS whose pool could
	// not be opened, with the error: each is reported as not audited.
	Unreachable map[string]error
	// JS reads the request stream (and, from checkpoints, its first
	// sequences).
	JS jetstream.JetStream
	// Progress, when non-nil, receives a progress bar while replaying (the
	// command passes stderr when it is a terminal).
	Progress io.Writer
	// Test holds the seams of the tests; the zero value is production.
	Test TestHooks
}

// TestHooks are the audit's test seams.
type TestHooks struct {
	// Apply, when set, replaces allocation.Apply as the domain under
	// audit: a test of the second opinion passes a wrong Apply.
	Apply func(*allocation.Activity, allocation.Request, uint64) (*allocation.Activity, allocation.Decision, error)
}

func (h TestHooks) apply() func(*allocation.Activity, allocation.Request, uint64) (*allocation.Activity, allocation.Decision, error) {
	if h.Apply != nil {
		return h.Apply
	}
	return allocation.Apply
}
