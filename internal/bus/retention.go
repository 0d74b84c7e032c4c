package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config is the configuration of the setup step (`allotctl setup`, and
// `make run`'s stack, which runs it first): the partitions, replicas and
// retention of the streams and buckets. No runtime binary reads it: they
// never create or change a stream. Every field means what its variable
// says; the JetStream values are its methods.
//
// The defaults: a week of history for the audit and for event consumers
// that were away. The request stream has no size bound by default:
// reaching one refuses every new request (it never drops an unapplied
// one), which is the outage retention is meant to prevent, and the server
// reserves a stream's size bound on disk when it creates it, so a large
// default would keep the streams from being created on a small disk. Its
// age bound alone keeps it at about a week of traffic. The event stream
// drops its oldest events at 1 GiB, which costs nothing but history. See
// docs/operations.md, "Retention".
type Config struct {
	Partitions       int           `envconfig:"PARTITIONS" default:"1" desc:"partitions of the request stream, fixed when it is created"`
	Replicas         int           `envconfig:"STREAM_REPLICAS" default:"1" desc:"replicas of the streams and buckets (3 on a cluster); never lowered on an existing one"`
	RequestsMaxAge   time.Duration `envconfig:"REQUESTS_MAX_AGE" default:"168h" desc:"requests older than this leave ALLOT_REQUESTS; 0 = no age limit"`
	RequestsMaxBytes int64         `envconfig:"REQUESTS_MAX_BYTES" default:"0" desc:"size bound of ALLOT_REQUESTS; when reached new requests are refused (503); 0 = no size limit"`
	EventsMaxAge     time.Duration `envconfig:"EVENTS_MAX_AGE" default:"168h" desc:"events older than this leave ALLOT_EVENTS; 0 = no age limit"`
	EventsMaxBytes   int64         `envconfig:"EVENTS_MAX_BYTES" default:"1073741824" desc:"size bound of ALLOT_EVENTS; the oldest events leave first; 0 = no size limit"`
}

// Validate reports the first invalid value as one sentence.
func (c Config) Validate() error {
	if c.Partitions < 1 || c.Partitions > 1024 {
		return fmt.Errorf("ALLOT_PARTITIONS must be between 1 and 1024, got %d", c.Partitions)
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return fmt.Errorf("ALLOT_STREAM_REPLICAS must be between 1 and 5, got %d", c.Replicas)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ALLOT_REQUESTS_MAX_AGE", c.RequestsMaxAge}, {"ALLOT_EVENTS_MAX_AGE", c.EventsMaxAge}} {
		if d.v < 0 || d.v > 0 && d.v < time.Second {
			return fmt.Errorf("%s must be 0 (no limit) or at least 1s, got %s", d.name, d.v)
		}
	}
	for _, b := range []struct {
		name string
		v    int64
	}{{"ALLOT_REQUESTS_MAX_BYTES", c.RequestsMaxBytes}, {"ALLOT_EVENTS_MAX_BYTES", c.EventsMaxBytes}} {
		if b.v < 0 || b.v > 0 && b.v < 1<<20 {
			return fmt.Errorf("%s must be 0 (no limit) or at least 1048576 (1 MiB), got %d", b.name, b.v)
		}
	}
	return nil
}

// RequestsRetention is ALLOT_REQUESTS' bounds as JetStream takes them.
func (c Config) RequestsRetention() Retention {
	return jetstreamRetention(c.RequestsMaxAge, c.RequestsMaxBytes)
}

// EventsRetention is ALLOT_EVENTS' bounds as JetStream takes them.
func (c Config) EventsRetention() Retention {
	return jetstreamRetention(c.EventsMaxAge, c.EventsMaxBytes)
}

// Retention bounds one stream in JetStream's terms: MaxAge 0 and MaxBytes
// -1 are no limit.
type Retention struct {
	MaxAge   time.Duration
	MaxBytes int64
}

// jetstreamRetention translates a setting's "0 = no limit" into the
// server's values: an age of 0 is already its "none", a size of 0 is -1.
func jetstreamRetention(age time.Duration, bytes int64) Retention {
	if bytes == 0 {
		bytes = -1
	}
	return Retention{MaxAge: age, MaxBytes: bytes}
}

// retentionOf is the bounds stream have has.
func retentionOf(have jetstream.StreamConfig) Retention {
	return Retention{MaxAge: have.MaxAge, MaxBytes: have.MaxBytes}
}

// duplicatesWithin keeps a stream's duplicate window inside its age limit,
// which the server requires.
func duplicatesWithin(window, maxAge time.Duration) time.Duration {
	if maxAge > 0 && maxAge < window {
		return maxAge
	}
	return window
}

// KeepReplicas returns the replicas stream should be set up with: want,
// but never fewer than the stream already has. A setup run without
// ALLOT_STREAM_REPLICAS (or with a smaller number) must not scale down what
// an operator made durable; lowering replicas is an operator's act (nats
// stream edit), never a side effect of a rerun.
func KeepReplicas(ctx context.Context, js jetstream.JetStream, stream string, want int) (int, error) {
	st, err := js.Stream(ctx, stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return max(want, 1), nil
	case err != nil:
		return 0, fmt.Errorf("%w: look up stream %s: %w", ErrUnavailable, stream, err)
	}
	return max(want, st.CachedInfo().Config.Replicas, 1), nil
}

// KeyValueStream is the name of the stream behind KV bucket.
func KeyValueStream(bucket string) string { return "KV_" + bucket }
