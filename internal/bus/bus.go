package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/wire"
)

// ErrUnavailable means NATS or JetStream did not take a message; nothing was
// stored. Edges map it to 503.
var ErrUnavailable = errors.New("the message broker is unavailable")

// Roles are the NATS users of deploy/nats/accounts.conf that a binary
// connects as, each named like the binary.
var Roles = []string{"ingest", "allocator", "notifier", "audit", "allotctl"}

// InboxPrefix is the inbox prefix of role's connections: _INBOX_<role>.
// Replies, pulled messages and watches arrive under it, and a role may
// subscribe to its own prefix only (accounts.conf), so that no role reads
// another's PubAcks or pulled requests.
func InboxPrefix(role string) string { return "_INBOX_" + role }

// Connect dials url and keeps reconnecting for ever, so a broker restart is
// survived without the caller's help. It fails fast when the first dial fails.
// A connection named like one of the Roles takes that role's InboxPrefix;
// extra options come last (an explicit nats.CustomInboxPrefix wins).
func Connect(url, name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	var inbox []nats.Option
	if slices.Contains(Roles, name) {
		inbox = append(inbox, nats.CustomInboxPrefix(InboxPrefix(name)))
	}
	opts := append(append(inbox,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectBufSize(-1), // fail publishes while down: no silent buffering
		nats.Timeout(5*time.Second),
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
	), extra...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: connect %s: %w", ErrUnavailable, redact(url), err)
	}
	return nc, nil
}

// DefaultRequestDuplicates is a new request stream's duplicate window;
// setup keeps an existing stream's, so an operator's setting survives a
// re-run. Ingest settles a lost PubAck within it.
const DefaultRequestDuplicates = 2 * time.Minute

// ErrPartitionsChanged means ALLOT_REQUESTS exists with another number of
// partitions than configured: the mapping of activities to partitions (and
// so their order) cannot change under a running system.
var ErrPartitionsChanged = errors.New("the request stream exists with another number of partitions")

// PartitionTransform maps alloc.req.<activity> to
// alloc.req.<partition>.<activity> when there are several partitions, with
// the server's own hash ({{partition(n,1)}}), so publishers keep the
// alloc.req.<activity> subjects.
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

// VoidCarrier is the activity whose subject carries the voids of
// partition p (wire.OpVoid): the smallest activity id the stream's
// transform sends to p. A void names no activity; its carrier only puts it
// in its partition's order.
func VoidCarrier(p, partitions int) int64 {
	if partitions <= 1 {
		return 1
	}
	for a := int64(1); ; a++ {
		if PartitionOf(a, partitions) == p {
			return a
		}
	}
}

// CheckRequestSubject is CheckSubject for any decoded request: a void
// (activity_id 0) must be stored on the carrier subject of the partition
// its request id names, any other request on its activity's subject.
func CheckRequestSubject(subject string, req wire.Request, partitions int) error {
	if req.Op != wire.OpVoid {
		return CheckSubject(subject, req.ActivityID, partitions)
	}
	id, err := uuid.Parse(req.RequestID)
	if err != nil {
		return fmt.Errorf("void: request_id: %w", err)
	}
	p := wire.PartitionOfID(id, partitions)
	if want := StoredSubject(VoidCarrier(p, partitions), partitions); subject != want {
		return fmt.Errorf("the void of %s (partition %d) belongs on %s, not on %s", req.RequestID, p, want, subject)
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

// RequestStream is ALLOT_REQUESTS as c sets it up (a new stream; Setup
// keeps an existing one's duplicate window and replicas): every request
// accepted, kept by limits (never by interest) so that the audit can
// replay it. When the size bound is reached new requests are refused
// (DiscardNew) rather than old ones dropped: a request the allocator has
// not applied yet must never leave the stream to make room. Only age
// removes requests.
func (c Config) RequestStream() jetstream.StreamConfig {
	return requestStream(c.Partitions, c.Replicas, c.RequestsRetention(), 0)
}

// requestStream is ALLOT_REQUESTS with partitions partitions, replicas
// copies, bounds r and duplicate window duplicates (0 = the default's).
func requestStream(partitions, replicas int, r Retention, duplicates time.Duration) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        wire.RequestStream,
		Description: "allot requests: join, cancel, claim, open; kept for audit replay",
		Subjects:    []string{wire.RequestSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		Duplicates:  duplicatesWithin(cmp.Or(duplicates, DefaultRequestDuplicates), r.MaxAge),
		Discard:     jetstream.DiscardNew,
		MaxAge:      r.MaxAge,
		MaxBytes:    r.MaxBytes,
		AllowDirect: true,
		// Ingest commits concurrent requests as one atomic batch under
		// load: one fsync for the group instead of one per request.
		AllowAtomicPublish: true,

		SubjectTransform: PartitionTransform(partitions),
		// Expires of holds, stored in ALLOT_HOLDS by the server's message
		// scheduler when they fall due, come in here on the activity's
		// subject: requests like any other, in the broker's order.
		Sources: []*jetstream.StreamSource{{
			Name: wire.HoldStream,
			SubjectTransforms: []jetstream.SubjectTransformConfig{{
				Source:      wire.HoldDuePrefix + "*",
				Destination: holdDueDestination(partitions),
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
// leaves before it is due. It has replicas copies.
func HoldStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        wire.HoldStream,
		Description: "allot hold expiries: one message schedule per hold, sourced into ALLOT_REQUESTS when due",
		Subjects:    []string{wire.HoldSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
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

// EventStream is ALLOT_EVENTS as c sets it up, fed by the allocator's
// outbox relay. The oldest events leave first when a bound is reached: the
// relay must never be refused, and MySQL keeps every event in
// processed_request.
func (c Config) EventStream() jetstream.StreamConfig {
	return eventStream(c.Replicas, c.EventsRetention())
}

// eventStream is ALLOT_EVENTS with replicas copies and bounds r.
func eventStream(replicas int, r Retention) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        wire.EventStream,
		Description: "allot events: opened, resized, confirmed, waitlisted, granted, promoted, cancelled, sold_out",
		Subjects:    []string{wire.EventSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
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

// EnsureStreams is Setup for callers that do not print what it changed:
// the tests' harnesses and benchmarks, which play the setup step (with
// one shard).
func EnsureStreams(ctx context.Context, js jetstream.JetStream, c Config) error {
	_, err := Setup(ctx, js, c, nil)
	return err
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

// ViewBucketConfig is ALLOT_VIEW, the KV bucket of full-activity views.
// It keeps one revision per key: only the latest view matters. It allows
// per-message TTLs (LimitMarkerTTL): a cleared view is put with one, so the
// bucket holds a key only while its activity is full, or briefly after.
func ViewBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         wire.ViewBucket,
		Description:    "allot: views of full activities, kept by the allocator, read by ingest to shed claims",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       max(replicas, 1),
		LimitMarkerTTL: ViewMarkerTTL,
	}
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
