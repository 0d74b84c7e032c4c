package audit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/wire"
)

// ErrShard is what Run returns (errors.Is) when one shard or more could
// not be audited (it does not answer, or its partition is being moved):
// the error names them, and the report returned with it holds every
// shard's, those with their Error.
var ErrShard = errors.New("audit: a shard could not be audited")

// ShardReport is the audit of one shard: the partitions the map puts on
// it and what was found there, or why it could not be audited.
type ShardReport struct {
	Shard      string `json:"shard"`
	Partitions []int  `json:"partitions"`
	// Error is why the shard could not be audited; its counts are then 0.
	Error string `json:"error,omitempty"`
	Report
}

// runShards audits every shard of deps.Shards (and deps.Unreachable): the
// map's partitions of each against its rows, each in a snapshot of its
// own (no transaction spans two shards), and every shard for rows of the
// partitions it does not own. With one shard owning every partition it is
// the audit of one database.
func runShards(ctx context.Context, cfg Config, deps Deps) (Report, error) {
	names := slices.Sorted(maps.Keys(deps.Shards))
	for n := range deps.Unreachable {
		if deps.Shards[n] == nil {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) == 0 {
		return Report{}, errors.New("audit: no MySQL shard to audit")
	}
	partitions, err := streamPartitions(ctx, deps.JS)
	if err != nil {
		return Report{}, err
	}
	for _, p := range cfg.Partitions {
		if p >= partitions {
			return Report{}, configError(fmt.Sprintf("partition %d: %s has %d partitions (0..%d)", p, wire.RequestStream, partitions, partitions-1))
		}
	}
	kv, places, err := readMap(ctx, deps.JS, names, partitions)
	if err != nil {
		return Report{}, err
	}
	if len(names) == 1 {
		if err := deps.Unreachable[names[0]]; err != nil {
			return Report{}, fmt.Errorf("%w: shard %s does not answer: %w", ErrShard, names[0], err)
		}
		return runOne(ctx, cfg, deps, deps.Shards[names[0]], scope{parts: partSet(cfg.Partitions)})
	}

	owner, epoch := make(map[int]string, partitions), make(map[int]uint64, partitions)
	for p, pl := range places {
		owner[p], epoch[p] = pl.Shard, pl.Epoch
	}
	filter := partSet(cfg.Partitions)
	d := deps
	d.Progress = nil // several replays at once: no bar
	reps := make([]ShardReport, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		parts := map[int]bool{}
		for p := range partitions {
			if owner[p] == name {
				reps[i].Partitions = append(reps[i].Partitions, p)
				if filter == nil || filter[p] {
					parts[p] = true
				}
			}
		}
		reps[i].Shard = name
		if err := deps.Unreachable[name]; err != nil {
			errs[i] = fmt.Errorf("shard %s does not answer: %w", name, err)
			continue
		}
		sc := scope{parts: parts, shard: &shardScope{name: name, owner: owner, epoch: epoch, filter: filter}}
		wg.Go(func() {
			rep, err := runOne(ctx, cfg, d, deps.Shards[name], sc)
			if err != nil {
				errs[i] = fmt.Errorf("shard %s: %w", name, err)
				return
			}
			reps[i].Report = rep
		})
	}
	wg.Wait()
	var failed []string
	for i, err := range errs {
		if err == nil {
			continue
		}
		if errors.Is(err, ErrInvalidConfig) {
			return Report{}, err
		}
		reps[i].Error = err.Error()
		failed = append(failed, err.Error())
	}
	// A move that ended while the shards were read: what was read of its
	// partition is of two moments.
	if kv != nil {
		now, err := shards.Read(ctx, kv)
		if err != nil {
			return Report{}, fmt.Errorf("%w: read the shard map again: %w", bus.ErrUnavailable, err)
		}
		for _, pl := range now {
			if was, ok := places[pl.Partition]; ok && was.Revision != 0 && pl.Revision != was.Revision {
				return Report{}, fmt.Errorf("audit: the shard map changed while the audit ran (partition %d is now on shard %s at epoch %d): audit again",
					pl.Partition, pl.Shard, pl.Epoch)
			}
		}
	}
	rep := combine(reps)
	if len(failed) > 0 {
		return rep, fmt.Errorf("%w: %s", ErrShard, strings.Join(failed, "; "))
	}
	return rep, nil
}

// streamPartitions is the number of partitions of the request stream.
func streamPartitions(ctx context.Context, js jetstream.JetStream) (int, error) {
	st, err := js.Stream(ctx, wire.RequestStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, fmt.Errorf("%w: stream %s does not exist on this NATS server (wrong ALLOT_NATS_URL?)", ErrIncompleteStream, wire.RequestStream)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: stream %s: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: stream %s info: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	return max(bus.PartitionsOf(info.Config), 1), nil
}

// readMap reads the partition → shard map, one placement per partition
// of the stream, each naming a shard of names. Without the bucket, or
// without an entry for a partition, the one shard of names holds it at
// epoch 1 (revision 0), as the allocator routes it; with several that is
// an error. kv is nil without the bucket.
func readMap(ctx context.Context, js jetstream.JetStream, names []string, partitions int) (jetstream.KeyValue, map[int]shards.Placement, error) {
	out := make(map[int]shards.Placement, partitions)
	kv, err := js.KeyValue(ctx, shards.Bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		if len(names) > 1 {
			return nil, nil, fmt.Errorf("audit: the shard map (bucket %s) is missing and ALLOT_MYSQL_SHARDS names %d shards: run `allotctl setup`, which creates and seeds it", shards.Bucket, len(names))
		}
		kv = nil
	case err != nil:
		return nil, nil, fmt.Errorf("%w: open %s: %w", bus.ErrUnavailable, shards.Bucket, err)
	default:
		pls, err := shards.Read(ctx, kv)
		if err != nil {
			return nil, nil, fmt.Errorf("audit: %w", err)
		}
		for _, pl := range pls {
			if pl.Partition < partitions {
				out[pl.Partition] = pl
			}
		}
	}
	for p := range partitions {
		pl, ok := out[p]
		switch {
		case !ok && len(names) > 1:
			return nil, nil, fmt.Errorf("audit: partition %d has no entry in the shard map (bucket %s): run `allotctl setup`, which seeds it", p, shards.Bucket)
		case !ok:
			out[p] = shards.Placement{Partition: p, Entry: shards.Entry{Shard: names[0], Epoch: 1}}
		case !slices.Contains(names, pl.Shard):
			return nil, nil, fmt.Errorf("audit: the shard map puts partition %d on shard %q, which ALLOT_MYSQL_SHARDS does not name (it names %s): audit with the allocator's ALLOT_MYSQL_SHARDS",
				p, pl.Shard, strings.Join(names, ", "))
		}
	}
	return kv, out, nil
}

// combine is the report of the whole audit: each shard's, and their sums;
// each divergence and checkpoint names its shard.
func combine(reps []ShardReport) Report {
	r := Report{Shards: reps, Divergences: []Divergence{}}
	failed := false
	for i := range reps {
		s := &reps[i]
		for j := range s.Divergences {
			s.Divergences[j].Shard = s.Shard
		}
		for j := range s.Checkpoints {
			s.Checkpoints[j].Shard = s.Shard
		}
		if s.Divergences == nil {
			s.Divergences = []Divergence{}
		}
		if s.Error != "" {
			failed = true
			continue
		}
		r.ActivitiesChecked += s.ActivitiesChecked
		r.Replayed += s.Replayed
		r.Messages += s.Messages
		r.Compared += s.Compared
		r.Skipped += s.Skipped
		r.Malformed += s.Malformed
		r.Pending += s.Pending
		r.LastSeq, r.Fence = max(r.LastSeq, s.LastSeq), max(r.Fence, s.Fence)
		if s.WindowStart > 0 && (r.WindowStart == 0 || s.WindowStart < r.WindowStart) {
			r.WindowStart = s.WindowStart
		}
		if s.VerifiedFrom > 0 {
			if r.VerifiedFrom == 0 || s.VerifiedFrom < r.VerifiedFrom {
				r.VerifiedFrom = s.VerifiedFrom
			}
			r.VerifiedTo = max(r.VerifiedTo, s.VerifiedTo)
		}
		r.Checkpoints = append(r.Checkpoints, s.Checkpoints...)
		r.Divergences = append(r.Divergences, s.Divergences...)
	}
	r.OK = !failed && len(r.Divergences) == 0
	return r
}
