package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
func Connect(url, name string, log *slog.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectBufSize(-1), // fail publishes while down: no silent buffering
		nats.Timeout(5*time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats disconnected", slog.Any("err", err))
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("nats reconnected", slog.String("url", c.ConnectedUrl()))
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: connect %s: %w", ErrUnavailable, url, err)
	}
	return nc, nil
}

// StreamConfig tunes the streams allot creates.
type StreamConfig struct {
	// Replicas is the stream replication factor (3 on a cluster).
	Replicas int
}

// RequestStreamConfig is ALLOT_REQUESTS: every request ever accepted, kept by
// limits (never by interest) so that the audit can replay it.
func RequestStreamConfig(c StreamConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        wire.RequestStream,
		Description: "allot requests: join, cancel, claim, open; kept for audit replay",
		Subjects:    []string{wire.RequestSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
		Duplicates:  2 * time.Minute,
		Discard:     jetstream.DiscardOld,
		AllowDirect: true,
	}
}

// EventStreamConfig is ALLOT_EVENTS, fed by the allocator's outbox relay.
func EventStreamConfig(c StreamConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        wire.EventStream,
		Description: "allot events: opened, resized, confirmed, waitlisted, granted, promoted, cancelled, sold_out",
		Subjects:    []string{wire.EventSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
		Duplicates:  10 * time.Minute,
		AllowDirect: true,
	}
}

// EnsureStreams creates or updates both streams.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, c StreamConfig) error {
	for _, cfg := range []jetstream.StreamConfig{RequestStreamConfig(c), EventStreamConfig(c)} {
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("%w: ensure stream %s: %w", ErrUnavailable, cfg.Name, err)
		}
	}
	return nil
}

// AllocatorConsumer is the durable name of the allocator's consumer on
// partition p.
func AllocatorConsumer(p int) string { return fmt.Sprintf("allocator-%d", p) }

// PartitionFilter is the subject filter of partition p.
func PartitionFilter(int) string { return wire.RequestSubjectPrefix + ">" }

// EnsureAllocatorConsumer creates or updates the durable pull consumer of
// partition p. Acks are explicit; AckWait is long because the allocator
// extends it while a batch's transaction retries.
func EnsureAllocatorConsumer(ctx context.Context, js jetstream.JetStream, p int, maxAckPending int, ackWait time.Duration) (jetstream.Consumer, error) {
	c, err := js.CreateOrUpdateConsumer(ctx, wire.RequestStream, jetstream.ConsumerConfig{
		Durable:       AllocatorConsumer(p),
		Description:   "allot allocator: applies requests in stream order",
		FilterSubject: PartitionFilter(p),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: maxAckPending,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: ensure consumer %s: %w", ErrUnavailable, AllocatorConsumer(p), err)
	}
	return c, nil
}

// EnsureViewBucket creates or opens the KV bucket of full-activity views.
// It keeps one revision per key: only the latest view matters.
func EnsureViewBucket(ctx context.Context, js jetstream.JetStream, c StreamConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      wire.ViewBucket,
		Description: "allot: views of full activities, kept by the allocator, read by ingest to shed claims",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: ensure bucket %s: %w", ErrUnavailable, wire.ViewBucket, err)
	}
	return kv, nil
}
