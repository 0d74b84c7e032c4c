package bus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/wire"
)

// The streams and buckets besides wire's: the notifier's dead letters, the
// idempotency keys of ingest and the allocators' membership.
const (
	// DLQStream keeps the events the notifier could not deliver; ALLOT_EVENTS
	// covers alloc.evt.> only.
	DLQStream = "ALLOT_DLQ"
	// DLQSubjects is what DLQStream stores.
	DLQSubjects = "alloc.dlq.>"
	// IdempotencyBucket maps an Idempotency-Key to its request.
	IdempotencyBucket = "ALLOT_IDEMPOTENCY"
	// IdempotencyTTL is how long an idempotency key is remembered.
	IdempotencyTTL = 24 * time.Hour
	// MembersBucket is where allocator processes announce themselves.
	MembersBucket = "ALLOT_ALLOCATORS"
	// MembersTTL is how long a silent allocator stays a member.
	MembersTTL = 5 * time.Second
)

// ErrNotSetUp means a stream or bucket a binary needs is missing or not
// configured as allot sets it up. Only `allotctl setup` creates and changes
// them: a runtime binary stops (exit 2) rather than wait or fix it.
var ErrNotSetUp = errors.New("run `allotctl setup`")

// IsSetupError reports whether err says the streams are not as this
// binary needs them (ErrNotSetUp, ErrPartitionsChanged): a reason to exit
// 2, never to retry.
func IsSetupError(err error) bool {
	return errors.Is(err, ErrNotSetUp) || errors.Is(err, ErrPartitionsChanged)
}

// notSetUp is the one line a binary prints: "stream ALLOT_REQUESTS does not
// exist: run `allotctl setup`".
func notSetUp(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrNotSetUp)
}

// DLQStreamConfig is ALLOT_DLQ: dead letters kept by limits (30 days, 1 GiB,
// oldest dropped first) on file storage, with replicas copies.
func DLQStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DLQStream,
		Description: "allot dead letters: events the notifier could not deliver",
		Subjects:    []string{DLQSubjects},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		MaxAge:      30 * 24 * time.Hour,
		MaxBytes:    1 << 30,
		Discard:     jetstream.DiscardOld,
		Duplicates:  10 * time.Minute,
		AllowDirect: true,
	}
}

// IdempotencyBucketConfig is ALLOT_IDEMPOTENCY, ingest's idempotency keys.
func IdempotencyBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      IdempotencyBucket,
		Description: "allot ingest: Idempotency-Key -> request_id, op, path, request message",
		History:     1,
		TTL:         IdempotencyTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
}

// MembersBucketConfig is ALLOT_ALLOCATORS: one key per live allocator
// process, which expires ttl after its last beat; in memory, since it is
// rebuilt within a beat.
func MembersBucketConfig(replicas int, ttl time.Duration) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      MembersBucket,
		Description: "allot: live allocator processes, for spreading partitions",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.MemoryStorage,
		Replicas:    max(replicas, 1),
	}
}

// ShardsBucket is the partition → shard map (internal/shards: key
// p.<partition>, value {"shard":...,"epoch":n}).
const ShardsBucket = shards.Bucket

// ShardsHistory is how many values of each partition's entry the map
// keeps: its last moves, for an operator to read.
const ShardsHistory = 16

// ShardsBucketConfig is ALLOT_SHARDS: one key per partition, never
// expiring, on file storage with replicas copies like the other buckets.
// Only `allotctl setup` seeds it and only compare-and-set changes it.
func ShardsBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      ShardsBucket,
		Description: "allot: partition -> MySQL shard and ownership epoch",
		History:     ShardsHistory,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
}

// Change is what Setup did to one stream or bucket.
type Change struct {
	Name   string // the stream (KV_<bucket> for a bucket)
	Action string // "created", "updated" or "unchanged"
	Config jetstream.StreamConfig
}

// Setup creates or updates every stream and bucket allot uses, from the
// builders above: ALLOT_HOLDS, ALLOT_REQUESTS, ALLOT_EVENTS, ALLOT_DLQ and
// the idempotency, view, membership and shard-map buckets, and seeds the
// shard map's missing entries with shardNames (ALLOT_MYSQL_SHARDS, in
// order: partition p on shardNames[p mod len(shardNames)]; empty = one
// shard, shards.DefaultName; a later change rewrites no entry). It is
// `allotctl setup`, run with an identity that may manage streams; no
// runtime binary calls it. It refuses to change the number of partitions
// of an existing request stream, never lowers replicas (KeepReplicas) and
// keeps an existing request stream's duplicate window. Run twice, the
// second run changes nothing.
func Setup(ctx context.Context, js jetstream.JetStream, c Config, shardNames []string) ([]Change, error) {
	var duplicates time.Duration // the default for a new stream
	if st, err := js.Stream(ctx, wire.RequestStream); err == nil {
		have := st.CachedInfo().Config
		if n := partitionsOf(have); n != c.Partitions {
			return nil, fmt.Errorf("%w: %s has %d, ALLOT_PARTITIONS is %d", ErrPartitionsChanged, wire.RequestStream, n, c.Partitions)
		}
		// An operator's duplicate window survives a re-run of setup.
		duplicates = have.Duplicates
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: look up stream %s: %w", ErrUnavailable, wire.RequestStream, err)
	}
	var out []Change
	stream := func(name string, build func(replicas int) jetstream.StreamConfig) error {
		replicas, err := KeepReplicas(ctx, js, name, c.Replicas)
		if err != nil {
			return err
		}
		ch, err := ensureStream(ctx, js, build(replicas))
		if err != nil {
			return err
		}
		out = append(out, ch)
		return nil
	}
	// ALLOT_HOLDS first: ALLOT_REQUESTS sources it.
	steps := []struct {
		name  string
		build func(int) jetstream.StreamConfig
	}{
		{wire.HoldStream, HoldStreamConfig},
		{wire.RequestStream, func(r int) jetstream.StreamConfig {
			return requestStream(c.Partitions, r, c.RequestsRetention(), duplicates)
		}},
		{wire.EventStream, func(r int) jetstream.StreamConfig { return eventStream(r, c.EventsRetention()) }},
		{DLQStream, DLQStreamConfig},
	}
	for _, s := range steps {
		if err := stream(s.name, s.build); err != nil {
			return out, err
		}
	}
	for _, kv := range []func(int) jetstream.KeyValueConfig{
		IdempotencyBucketConfig,
		ViewBucketConfig,
		func(r int) jetstream.KeyValueConfig { return MembersBucketConfig(r, MembersTTL) },
		ShardsBucketConfig,
	} {
		name := KeyValueStream(kv(1).Bucket)
		replicas, err := KeepReplicas(ctx, js, name, c.Replicas)
		if err != nil {
			return out, err
		}
		ch, err := ensureBucket(ctx, js, kv(replicas))
		if err != nil {
			return out, err
		}
		out = append(out, ch)
	}
	if err := seedShards(ctx, js, c.Partitions, shardNames); err != nil {
		return out, err
	}
	return out, nil
}

// seedShards gives every partition without an entry in ALLOT_SHARDS its
// seed (partition mod the number of shards); existing entries stay.
func seedShards(ctx context.Context, js jetstream.JetStream, partitions int, names []string) error {
	kv, err := js.KeyValue(ctx, ShardsBucket)
	if err != nil {
		return fmt.Errorf("%w: open bucket %s: %w", ErrUnavailable, ShardsBucket, err)
	}
	if _, err := shards.Seed(ctx, kv, partitions, names); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// ensureStream creates or updates one stream and says which it did.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (Change, error) {
	before, err := streamConfig(ctx, js, cfg.Name)
	if err != nil {
		return Change{}, err
	}
	st, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return Change{}, fmt.Errorf("%w: set up stream %s: %w", ErrUnavailable, cfg.Name, err)
	}
	return change(cfg.Name, before, st.CachedInfo().Config), nil
}

// ensureBucket creates or updates one KV bucket and says which it did.
func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (Change, error) {
	name := KeyValueStream(cfg.Bucket)
	before, err := streamConfig(ctx, js, name)
	if err != nil {
		return Change{}, err
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
		return Change{}, fmt.Errorf("%w: set up bucket %s: %w", ErrUnavailable, cfg.Bucket, err)
	}
	after, err := streamConfig(ctx, js, name)
	if err != nil {
		return Change{}, err
	}
	if after == nil {
		return Change{}, fmt.Errorf("%w: bucket %s gone right after its setup", ErrUnavailable, cfg.Bucket)
	}
	return change(name, before, *after), nil
}

// streamConfig is the configuration of stream name, nil when it does not
// exist.
func streamConfig(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamConfig, error) {
	st, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%w: look up stream %s: %w", ErrUnavailable, name, err)
	}
	cfg := st.CachedInfo().Config
	return &cfg, nil
}

func change(name string, before *jetstream.StreamConfig, after jetstream.StreamConfig) Change {
	switch {
	case before == nil:
		return Change{Name: name, Action: "created", Config: after}
	case reflect.DeepEqual(*before, after):
		return Change{Name: name, Action: "unchanged", Config: after}
	}
	return Change{Name: name, Action: "updated", Config: after}
}

// The checks of the runtime binaries: at start each looks up what it needs
// and stops (ErrNotSetUp) if it is missing or differs from its builder in
// what the binary's correctness depends on; JetStream not answering is
// ErrUnavailable (wait and retry), as before.

// CheckRequestStream checks ALLOT_REQUESTS: its subjects, limits retention
// on file storage, DiscardNew (never an unapplied request dropped), the
// duplicate window of its age limit, atomic batches, direct gets, the
// partitions (any when partitions is 0) and the source of hold expiries.
// It returns the stream and its number of partitions.
func CheckRequestStream(ctx context.Context, js jetstream.JetStream, partitions int) (jetstream.Stream, int, error) {
	st, have, err := lookUp(ctx, js, wire.RequestStream)
	if err != nil {
		return nil, 0, err
	}
	n := partitionsOf(have)
	if n == 0 {
		return nil, 0, notSetUp("stream %s has a subject transform allot does not know (%v)", wire.RequestStream, have.SubjectTransform)
	}
	if partitions != 0 && n != partitions {
		return nil, 0, fmt.Errorf("%w: %s has %d, ALLOT_PARTITIONS is %d: set ALLOT_PARTITIONS=%d", ErrPartitionsChanged, wire.RequestStream, n, partitions, n)
	}
	// The duplicate window is the operator's to choose (ingest settles lost
	// PubAcks within whatever it is), so it is taken as it is.
	want := requestStream(n, 1, retentionOf(have), have.Duplicates)
	if err := sameStream(want, have, "SubjectTransform", "Sources", "AllowAtomicPublish", "AllowDirect"); err != nil {
		return nil, 0, err
	}
	return st, n, nil
}

// CheckHoldStream checks ALLOT_HOLDS: message schedules (and the roll-ups
// they need) and age-only retention longer than any hold.
func CheckHoldStream(ctx context.Context, js jetstream.JetStream) error {
	_, have, err := lookUp(ctx, js, wire.HoldStream)
	if err != nil {
		return err
	}
	return sameStream(HoldStreamConfig(1), have, "MaxAge", "AllowMsgSchedules", "AllowRollup", "AllowAtomicPublish")
}

// CheckEventStream checks ALLOT_EVENTS: what the relay publishes (atomic
// batches, deduplicated by event id) and what consumers read.
func CheckEventStream(ctx context.Context, js jetstream.JetStream) error {
	_, have, err := lookUp(ctx, js, wire.EventStream)
	if err != nil {
		return err
	}
	return sameStream(eventStream(1, retentionOf(have)), have, "AllowAtomicPublish")
}

// CheckDLQStream checks ALLOT_DLQ.
func CheckDLQStream(ctx context.Context, js jetstream.JetStream) error {
	_, have, err := lookUp(ctx, js, DLQStream)
	if err != nil {
		return err
	}
	return sameStream(DLQStreamConfig(1), have)
}

// CheckBucket opens the KV bucket of cfg (one of the builders' results)
// after checking its history, TTL, storage and per-message TTL against it.
func CheckBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	name := KeyValueStream(cfg.Bucket)
	_, have, err := lookUp(ctx, js, name)
	if err != nil {
		return nil, notSetUpBucket(err, name, cfg.Bucket)
	}
	history := max(cfg.History, 1)
	for _, d := range []struct {
		what       string
		have, want any
	}{
		{"history", have.MaxMsgsPerSubject, int64(history)},
		{"ttl", have.MaxAge, cfg.TTL},
		{"storage", have.Storage, cfg.Storage},
		{"per-key ttl", have.AllowMsgTTL, cfg.LimitMarkerTTL > 0},
		{"limit marker ttl", have.SubjectDeleteMarkerTTL, cfg.LimitMarkerTTL},
	} {
		if !reflect.DeepEqual(d.have, d.want) {
			return nil, notSetUp("bucket %s is not as allot sets it up (%s %v, want %v)", cfg.Bucket, d.what, d.have, d.want)
		}
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("%w: open bucket %s: %w", ErrUnavailable, cfg.Bucket, err)
	}
	return kv, nil
}

// notSetUpBucket says "bucket X" rather than "stream KV_X".
func notSetUpBucket(err error, stream, bucket string) error {
	if errors.Is(err, ErrNotSetUp) {
		return notSetUp("bucket %s does not exist", bucket)
	}
	return err
}

// lookUp reads stream name's configuration: ErrNotSetUp when it does not
// exist, ErrUnavailable when JetStream does not answer.
func lookUp(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, jetstream.StreamConfig, error) {
	st, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, jetstream.StreamConfig{}, notSetUp("stream %s does not exist", name)
	case err != nil:
		return nil, jetstream.StreamConfig{}, fmt.Errorf("%w: look up stream %s: %w", ErrUnavailable, name, err)
	}
	return st, st.CachedInfo().Config, nil
}

// sameStream compares what every stream check compares (subjects,
// retention kind, storage, discard policy, duplicate window) and the extra
// fields named, and reports the first difference.
func sameStream(want, have jetstream.StreamConfig, extra ...string) error {
	fields := append([]string{"Subjects", "Retention", "Storage", "Discard", "Duplicates"}, extra...)
	w, h := reflect.ValueOf(want), reflect.ValueOf(have)
	for _, f := range fields {
		wf, hf := w.FieldByName(f).Interface(), h.FieldByName(f).Interface()
		if f == "Sources" {
			wf, hf = sourcesOf(want.Sources), sourcesOf(have.Sources)
		}
		if !reflect.DeepEqual(wf, hf) {
			return notSetUp("stream %s is not as allot sets it up (%s %s, want %s)", want.Name, f, show(hf), show(wf))
		}
	}
	return nil
}

// sourcesOf is what matters of a stream's sources: the names and their
// subject transforms (the server fills in the rest).
func sourcesOf(src []*jetstream.StreamSource) []string {
	var out []string
	for _, s := range src {
		d := s.Name
		for _, t := range s.SubjectTransforms {
			d += " " + t.Source + "->" + t.Destination
		}
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

func show(v any) string {
	switch x := v.(type) {
	case *jetstream.SubjectTransformConfig:
		if x == nil {
			return "none"
		}
		return x.Source + "->" + x.Destination
	case fmt.Stringer:
		return x.String()
	}
	return fmt.Sprint(v)
}

// WriteChanges prints what Setup did, one line a stream or bucket.
func WriteChanges(w io.Writer, changes []Change) {
	for _, c := range changes {
		cfg := c.Config
		line := fmt.Sprintf("%-22s %-9s replicas=%d storage=%s", c.Name, c.Action, cfg.Replicas, cfg.Storage)
		if c.Name == wire.RequestStream {
			line += fmt.Sprintf(" partitions=%d", partitionsOf(cfg))
		}
		line += fmt.Sprintf(" max_age=%s max_bytes=%d discard=%s duplicates=%s", cfg.MaxAge, cfg.MaxBytes, cfg.Discard, cfg.Duplicates)
		fmt.Fprintln(w, line)
	}
}

// SetupWait is Setup, retried while JetStream does not answer (Retry)
// until ctx ends: what `allotctl setup` and `make run` run.
func SetupWait(ctx context.Context, js jetstream.JetStream, c Config, shardNames []string, log *slog.Logger) ([]Change, error) {
	var changes []Change
	err := Retry(ctx, log, "setup", StartAttempt, func(ctx context.Context) error {
		var err error
		changes, err = Setup(ctx, js, c, shardNames)
		return err
	})
	return changes, err
}
