package bus

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/wire"
)

// ErrUnavailable means NATS or JetStream did not take a message; nothing was
// stored. Edges map it to 503.
var ErrUnavailable = errors.New("the message broker is unavailable")

// Connect dials url and keeps reconnecting for ever, so a broker restart is
// survived without the caller's help. It fails fast when the first dial fails.
func Connect(url, name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1), // fail publishes while down: no silent buffering
		nats.Timeout(5 * time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats disconnected", slog.Any("err", err))
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("nats reconnected", slog.String("url", c.ConnectedUrlRedacted()))
		}),
		// A permissions violation (a subject this process's NATS user may
		// not use) is a deployment error worth a loud line.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			attrs := []any{slog.Any("err", err)}
			if sub != nil {
				attrs = append(attrs, slog.String("subject", sub.Subject))
			}
			if errors.Is(err, nats.ErrPermissionViolation) {
				log.Error("nats permissions violation: this process's NATS user may not use the subject", attrs...)
				return
			}
			log.Warn("nats async error", attrs...)
		}),
	}, extra...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: connect %s: %w", ErrUnavailable, redact(url), err)
	}
	return nc, nil
}

// StreamConfig tunes the streams allot creates.
type StreamConfig struct {
	// Replicas is the stream replication factor (ALLOT_STREAM_REPLICAS, 3 on
	// a cluster); 0 keeps what an existing stream has (1 for a new one), so
	// a binary that does not own the setting never scales a stream down.
	Replicas int
	// Partitions splits the request stream into this many partitions
	// (ALLOT_PARTITIONS). It is fixed when the stream is created: 0 takes
	// what the stream has (1 for a new one); another number than the
	// stream's is an error.
	Partitions int
	// Requests and Events bound the two streams (ALLOT_REQUESTS_MAX_AGE and
	// the others; see RetentionEnv). A zero Retention keeps what an
	// existing stream has (the defaults for a new one), so a binary that
	// does not own the setting never changes it.
	Requests, Events Retention
}

// ErrPartitionsChanged means ALLOT_REQUESTS exists with another number of
// partitions than configured: the mapping of activities to partitions (and
// so their order) cannot change under a running system.
var ErrPartitionsChanged = errors.New("the request stream exists with another number of partitions")

// PartitionTransform maps alloc.req.<activity> to
// alloc.req.<partition>.<activity> when there are several partitions, with
// the server's own hash ({{partition(n,1)}}), so publishers keep the
// contract's subjects.
func PartitionTransform(partitions int) *jetstream.SubjectTransformConfig {
	if partitions <= 1 {
		return nil
	}
	return &jetstream.SubjectTransformConfig{
		Source:      wire.RequestSubjectPrefix + "*",
		Destination: fmt.Sprintf("%s{{partition(%d,1)}}.{{wildcard(1)}}", wire.RequestSubjectPrefix, partitions),
	}
}

// PartitionOf is the partition the stream's transform sends activity to:
// FNV-1a of its decimal id modulo partitions, as nats-server computes it.
func PartitionOf(activity int64, partitions int) int {
	if partitions <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(strconv.FormatInt(activity, 10)))
	return int(h.Sum32() % uint32(partitions))
}

// StoredSubject is the subject a request for activity is stored on: the
// published alloc.req.<activity>, or alloc.req.<partition>.<activity>.
func StoredSubject(activity int64, partitions int) string {
	if partitions <= 1 {
		return wire.RequestSubject(activity)
	}
	return wire.RequestSubjectPrefix + strconv.Itoa(PartitionOf(activity, partitions)) + "." + strconv.FormatInt(activity, 10)
}

// CheckSubject refuses a request for activity stored on another subject
// than the stream's transform would have chosen (published straight to
// alloc.req.<p>.<a> with the wrong p): two allocators would otherwise apply
// one activity. The allocator and the audit both apply it.
func CheckSubject(subject string, activity int64, partitions int) error {
	if want := StoredSubject(activity, partitions); subject != want {
		return fmt.Errorf("activity %d belongs on %s, not on %s", activity, want, subject)
	}
	return nil
}

// PartitionsOf reads the number of partitions from the request stream's
// configuration (0 when its transform is not allot's).
func PartitionsOf(cfg jetstream.StreamConfig) int { return partitionsOf(cfg) }

// partitionsOf reads the number of partitions from a stream's transform.
func partitionsOf(cfg jetstream.StreamConfig) int {
	if cfg.SubjectTransform == nil {
		return 1
	}
	var n int
	if _, err := fmt.Sscanf(strings.TrimPrefix(cfg.SubjectTransform.Destination, wire.RequestSubjectPrefix), "{{partition(%d,1)}}", &n); err != nil || n < 1 {
		return 0
	}
	return n
}

// RequestStreamConfig is ALLOT_REQUESTS: every request accepted, kept by
// limits (never by interest) so that the audit can replay it. When the size
// bound is reached new requests are refused (DiscardNew) rather than old
// ones dropped: a request the allocator has not applied yet must never
// leave the stream to make room. Only age removes requests.
func RequestStreamConfig(c StreamConfig) jetstream.StreamConfig {
	r := c.Requests.orDefault(DefaultRequestsMaxAge, DefaultRequestsMaxBytes)
	return jetstream.StreamConfig{
		Name:        wire.RequestStream,
		Description: "allot requests: join, cancel, claim, open; kept for audit replay",
		Subjects:    []string{wire.RequestSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
		Duplicates:  duplicatesWithin(2*time.Minute, r.MaxAge),
		Discard:     jetstream.DiscardNew,
		MaxAge:      r.MaxAge,
		MaxBytes:    r.MaxBytes,
		AllowDirect: true,
		// Ingest commits concurrent requests as one atomic batch under
		// load: one fsync for the group instead of one per request.
		AllowAtomicPublish: true,

		SubjectTransform: PartitionTransform(c.Partitions),
		// Expires of holds, stored in ALLOT_HOLDS by the server's message
		// scheduler when they fall due, come in here on the activity's
		// subject: requests like any other, in the broker's order.
		Sources: []*jetstream.StreamSource{{
			Name: wire.HoldStream,
			SubjectTransforms: []jetstream.SubjectTransformConfig{{
				Source:      wire.HoldDuePrefix + "*",
				Destination: holdDueDestination(c.Partitions),
			}},
		}},
	}
}

// holdDueDestination maps alloc.hold.due.<activity> to the subject a
// request for activity is stored on: alloc.req.<activity>, or
// alloc.req.<partition>.<activity> with the same hash as the stream's own
// transform, so an expire reaches the partition of its activity.
func holdDueDestination(partitions int) string {
	if partitions <= 1 {
		return wire.RequestSubjectPrefix + "{{wildcard(1)}}"
	}
	return fmt.Sprintf("%s{{partition(%d,1)}}.{{wildcard(1)}}", wire.RequestSubjectPrefix, partitions)
}

// HoldStreamConfig is ALLOT_HOLDS: one message schedule per hold, due
// when the hold lapses, whose expire the server stores on
// alloc.hold.due.<activity>, to be sourced into ALLOT_REQUESTS. Schedules
// cannot live in ALLOT_REQUESTS itself: the server refuses them in a stream
// that discards new messages when full, and refuses roll-ups nowhere it has
// them. Kept by age only, longer than the longest hold, so a schedule never
// leaves before it is due.
func HoldStreamConfig(c StreamConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        wire.HoldStream,
		Description: "allot hold expiries: one message schedule per hold, sourced into ALLOT_REQUESTS when due",
		Subjects:    []string{wire.HoldSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
		Duplicates:  10 * time.Minute,
		Discard:     jetstream.DiscardOld,
		MaxAge:      wire.MaxHold + 24*time.Hour,
		AllowDirect: true,
		// A schedule rolls up its own subject: the server requires
		// roll-ups (and purges) allowed in a stream with schedules.
		AllowMsgSchedules: true,
		AllowRollup:       true,
		// The relay schedules a resize's thousands of holds in atomic
		// batches: one fsync per batch.
		AllowAtomicPublish: true,
	}
}

// EventStreamConfig is ALLOT_EVENTS, fed by the allocator's outbox relay.
// The oldest events leave first when a bound is reached: the relay must
// never be refused, and MySQL keeps every event in processed_request.
func EventStreamConfig(c StreamConfig) jetstream.StreamConfig {
	r := c.Events.orDefault(DefaultEventsMaxAge, DefaultEventsMaxBytes)
	return jetstream.StreamConfig{
		Name:        wire.EventStream,
		Description: "allot events: opened, resized, confirmed, waitlisted, granted, promoted, cancelled, sold_out",
		Subjects:    []string{wire.EventSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
		Duplicates:  duplicatesWithin(10*time.Minute, r.MaxAge),
		Discard:     jetstream.DiscardOld,
		MaxAge:      r.MaxAge,
		MaxBytes:    r.MaxBytes,
		AllowDirect: true,
		// The relay publishes a pass's events in atomic batches: one
		// fsync per batch instead of one per event.
		AllowAtomicPublish: true,
	}
}

// EnsureStreams creates or updates both streams. It refuses to change the
// number of partitions of an existing request stream.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, c StreamConfig) error {
	rc := c
	if st, err := js.Stream(ctx, wire.RequestStream); err == nil {
		have := st.CachedInfo().Config
		if rc.Partitions == 0 {
			rc.Partitions = partitionsOf(have)
		}
		if partitionsOf(have) != rc.Partitions {
			return fmt.Errorf("%w: %s has %d, ALLOT_PARTITIONS is %d", ErrPartitionsChanged, wire.RequestStream, partitionsOf(have), rc.Partitions)
		}
		// Never fewer replicas than the stream has (KeepReplicas).
		rc.Replicas = max(rc.Replicas, have.Replicas)
		rc.Requests = rc.Requests.orHave(have)
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: look up stream %s: %w", ErrUnavailable, wire.RequestStream, err)
	}
	if err := ensureHoldStream(ctx, js, rc.Replicas); err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateStream(ctx, RequestStreamConfig(rc)); err != nil {
		return fmt.Errorf("%w: ensure stream %s: %w", ErrUnavailable, wire.RequestStream, err)
	}
	return EnsureEventStream(ctx, js, c)
}

// ensureHoldStream creates or updates ALLOT_HOLDS, never with fewer
// replicas than it has.
func ensureHoldStream(ctx context.Context, js jetstream.JetStream, replicas int) error {
	replicas, err := KeepReplicas(ctx, js, wire.HoldStream, replicas)
	if err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateStream(ctx, HoldStreamConfig(StreamConfig{Replicas: replicas})); err != nil {
		return fmt.Errorf("%w: ensure stream %s: %w", ErrUnavailable, wire.HoldStream, err)
	}
	return nil
}

// EnsureEventStream creates or updates ALLOT_EVENTS alone: what a consumer
// of events (the notifier) needs, without a say over the request stream.
func EnsureEventStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) error {
	st, err := js.Stream(ctx, wire.EventStream)
	switch {
	case err == nil:
		have := st.CachedInfo().Config
		c.Replicas = max(c.Replicas, have.Replicas)
		c.Events = c.Events.orHave(have)
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: look up stream %s: %w", ErrUnavailable, wire.EventStream, err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, EventStreamConfig(c)); err != nil {
		return fmt.Errorf("%w: ensure stream %s: %w", ErrUnavailable, wire.EventStream, err)
	}
	return nil
}

// AllocatorConsumer is the durable name of the allocator's consumer on
// partition p.
func AllocatorConsumer(p int) string { return fmt.Sprintf("allocator-%d", p) }

// PartitionFilter is the subject filter of partition p of partitions.
func PartitionFilter(p, partitions int) string {
	if partitions <= 1 {
		return wire.RequestSubjectPrefix + ">"
	}
	return wire.RequestSubjectPrefix + strconv.Itoa(p) + ".*"
}

// PriorityGroup is the pinned priority group of the allocator consumers.
const PriorityGroup = "allocators"

// ConsumerConfig tunes EnsureAllocatorConsumer.
type ConsumerConfig struct {
	Partition, Partitions int
	MaxAckPending         int
	AckWait               time.Duration
	// PinnedTTL is how long the server keeps a partition pinned to an
	// allocator that stopped pulling before it pins another: the failover
	// time.
	PinnedTTL time.Duration
}

// EnsureAllocatorConsumer creates or updates the durable pull consumer of a
// partition: explicit acks, and a pinned priority group, so that the server
// hands the partition to one allocator at a time and to a survivor when
// that one stops pulling. Pinning is not a hard guarantee; MySQL's fence is.
func EnsureAllocatorConsumer(ctx context.Context, js jetstream.JetStream, cc ConsumerConfig) (jetstream.Consumer, error) {
	c, err := js.CreateOrUpdateConsumer(ctx, wire.RequestStream, jetstream.ConsumerConfig{
		Durable:        AllocatorConsumer(cc.Partition),
		Description:    "allot allocator: applies requests in stream order",
		FilterSubject:  PartitionFilter(cc.Partition, cc.Partitions),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        cc.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  cc.MaxAckPending,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{PriorityGroup},
		PinnedTTL:      cc.PinnedTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: ensure consumer %s: %w", ErrUnavailable, AllocatorConsumer(cc.Partition), err)
	}
	return c, nil
}

// ViewMarkerTTL is how long the view bucket keeps the marker the server
// leaves when a message with a TTL (a cleared view) expires: the least the
// server allows, since nothing reads it.
const ViewMarkerTTL = time.Second

// EnsureViewBucket creates or opens the KV bucket of full-activity views.
// It keeps one revision per key: only the latest view matters. It allows
// per-message TTLs (LimitMarkerTTL): a cleared view is put with one, so the
// bucket holds a key only while its activity is full, or briefly after.
func EnsureViewBucket(ctx context.Context, js jetstream.JetStream, c StreamConfig) (jetstream.KeyValue, error) {
	var err error
	if c.Replicas, err = KeepReplicas(ctx, js, KeyValueStream(wire.ViewBucket), c.Replicas); err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         wire.ViewBucket,
		Description:    "allot: views of full activities, kept by the allocator, read by ingest to shed claims",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       c.Replicas,
		LimitMarkerTTL: ViewMarkerTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: ensure bucket %s: %w", ErrUnavailable, wire.ViewBucket, err)
	}
	return kv, nil
}

// redact hides the userinfo of each URL of a NATS URL list, for errors.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if scheme, rest, ok := strings.Cut(p, "://"); ok {
			if at := strings.LastIndex(rest, "@"); at >= 0 { // a password may hold @
				parts[i] = scheme + "://*****" + rest[at:]
			}
		}
	}
	return strings.Join(parts, ",")
}
