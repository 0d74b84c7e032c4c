package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of the streams' retention: a week of history for the audit and
// for event consumers that were away. The request stream has no size bound
// by default: reaching one refuses every new request (it never drops an
// unapplied one), which is the outage retention is meant to prevent, and
// the server reserves a stream's size bound on disk when it creates it, so
// a large default would keep the streams from being created on a small
// disk. Its age bound alone keeps it at about a week of traffic. The event
// stream drops its oldest events at 1 GiB, which costs nothing but
// history. See docs/operations.md, "Retention".
const (
	DefaultRequestsMaxAge   = 7 * 24 * time.Hour
	DefaultRequestsMaxBytes = -1 // none
	DefaultEventsMaxAge     = 7 * 24 * time.Hour
	DefaultEventsMaxBytes   = 1 << 30
)

// Retention bounds one stream. A zero field takes its default; a negative
// one means unlimited (the server's -1).
type Retention struct {
	MaxAge   time.Duration
	MaxBytes int64
}

// orHave is r, or, when r is zero (a binary that does not own the
// setting), the bounds the existing stream has; its age limit 0 (none)
// becomes -1, which orDefault keeps as none.
func (r Retention) orHave(have jetstream.StreamConfig) Retention {
	if r != (Retention{}) {
		return r
	}
	r = Retention{MaxAge: have.MaxAge, MaxBytes: have.MaxBytes}
	if r.MaxAge == 0 {
		r.MaxAge = -1
	}
	return r
}

func (r Retention) orDefault(age time.Duration, bytes int64) Retention {
	if r.MaxAge == 0 {
		r.MaxAge = age
	}
	if r.MaxBytes == 0 {
		r.MaxBytes = bytes
	}
	if r.MaxAge < 0 {
		r.MaxAge = 0 // the server's "unlimited"
	}
	if r.MaxBytes < 0 {
		r.MaxBytes = -1
	}
	return r
}

// RetentionEnv is the retention part of the setup step's configuration
// (ALLOT_REQUESTS_MAX_AGE and the others; see SetupEnv).
type RetentionEnv struct {
	RequestsMaxAge   time.Duration `envconfig:"REQUESTS_MAX_AGE" default:"168h" desc:"requests older than this leave ALLOT_REQUESTS; 0 = no age limit"`
	RequestsMaxBytes int64         `envconfig:"REQUESTS_MAX_BYTES" default:"0" desc:"size bound of ALLOT_REQUESTS; when reached new requests are refused (503); 0 = no size limit"`
	EventsMaxAge     time.Duration `envconfig:"EVENTS_MAX_AGE" default:"168h" desc:"events older than this leave ALLOT_EVENTS; 0 = no age limit"`
	EventsMaxBytes   int64         `envconfig:"EVENTS_MAX_BYTES" default:"1073741824" desc:"size bound of ALLOT_EVENTS; the oldest events leave first; 0 = no size limit"`
}

// Validate reports the first invalid value as one sentence.
func (e RetentionEnv) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ALLOT_REQUESTS_MAX_AGE", e.RequestsMaxAge}, {"ALLOT_EVENTS_MAX_AGE", e.EventsMaxAge}} {
		if d.v < 0 || d.v > 0 && d.v < time.Second {
			return fmt.Errorf("%s must be 0 (no limit) or at least 1s, got %s", d.name, d.v)
		}
	}
	for _, b := range []struct {
		name string
		v    int64
	}{{"ALLOT_REQUESTS_MAX_BYTES", e.RequestsMaxBytes}, {"ALLOT_EVENTS_MAX_BYTES", e.EventsMaxBytes}} {
		if b.v < 0 || b.v > 0 && b.v < 1<<20 {
			return fmt.Errorf("%s must be 0 (no limit) or at least 1048576 (1 MiB), got %d", b.name, b.v)
		}
	}
	return nil
}

// Apply copies the settings into c, where 0 ("no limit") becomes the
// negative value StreamConfig reads as unlimited.
func (e RetentionEnv) Apply(c StreamConfig) StreamConfig {
	unlimitedAge := func(d time.Duration) time.Duration {
		if d == 0 {
			return -1
		}
		return d
	}
	unlimitedBytes := func(n int64) int64 {
		if n == 0 {
			return -1
		}
		return n
	}
	c.Requests = Retention{MaxAge: unlimitedAge(e.RequestsMaxAge), MaxBytes: unlimitedBytes(e.RequestsMaxBytes)}
	c.Events = Retention{MaxAge: unlimitedAge(e.EventsMaxAge), MaxBytes: unlimitedBytes(e.EventsMaxBytes)}
	return c
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

// SetupEnv is the configuration of the setup step (`allotctl setup`, and
// `make run`'s stack, which runs it first): the partitions, replicas and
// retention of the streams and buckets. No runtime binary reads it: they
// never create or change a stream.
type SetupEnv struct {
	Partitions int `envconfig:"PARTITIONS" default:"1" desc:"partitions of the request stream, fixed when it is created"`
	Replicas   int `envconfig:"STREAM_REPLICAS" default:"1" desc:"replicas of the streams and buckets (3 on a cluster); never lowered on an existing one"`
	RetentionEnv
}

// Validate reports the first invalid value as one sentence.
func (e SetupEnv) Validate() error {
	if e.Partitions < 1 || e.Partitions > 1024 {
		return fmt.Errorf("ALLOT_PARTITIONS must be between 1 and 1024, got %d", e.Partitions)
	}
	if e.Replicas < 1 || e.Replicas > 5 {
		return fmt.Errorf("ALLOT_STREAM_REPLICAS must be between 1 and 5, got %d", e.Replicas)
	}
	return e.RetentionEnv.Validate()
}

// StreamConfig is what Setup takes.
func (e SetupEnv) StreamConfig() StreamConfig {
	return e.RetentionEnv.Apply(StreamConfig{Partitions: e.Partitions, Replicas: e.Replicas})
}
