package notifier

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// Config is the notifier's configuration: the ALLOT_NOTIFY_ variables
// (cmd/notifier embeds it next to config.Common). Defaults live in the
// default tags only; a test starts from config.Defaults[notifier.Config]().
type Config struct {
	// URL is the webhook each event is POSTed to (body: the event JSON as
	// stored; headers: Content-Type: application/json, Idempotency-Key:
	// event_id). User info in it is sent as basic auth; redirects are not
	// followed. Empty means log each event instead.
	URL SecretURL `envconfig:"NOTIFY_URL" desc:"webhook URL events are POSTed to; empty = log them only"`
	// Filter is the consumer's subject filter, within alloc.evt.>, or
	// several separated by commas (they must not overlap), e.g.
	// "alloc.evt.*.promoted,alloc.evt.*.expired" for an activity with
	// holds: who got a seat to confirm, and whose hold lapsed.
	Filter string `envconfig:"NOTIFY_FILTER" default:"alloc.evt.*.promoted" desc:"subject filter within alloc.evt.>, or several separated by commas (e.g. alloc.evt.*.promoted,alloc.evt.*.expired)"`
	// Durable is the consumer's durable name: a new process with the same
	// name resumes where the previous one stopped.
	Durable string `envconfig:"NOTIFY_DURABLE" default:"notifier" desc:"durable consumer name"`
	// Timeout bounds one webhook attempt, reading the answer included.
	Timeout time.Duration `envconfig:"NOTIFY_TIMEOUT" default:"5s" desc:"one webhook attempt"`
	// MaxAttempts is how many times one delivery tries the webhook before the
	// event is dead-lettered. The budget is per delivery: a redelivery after
	// a restart starts again from 1.
	MaxAttempts int `envconfig:"NOTIFY_MAX_ATTEMPTS" default:"8" desc:"attempts before an event is dead-lettered"`
	// BackoffBase and BackoffMax shape the wait before attempt n+1: a random
	// duration in [0, min(BackoffMax, BackoffBase·2^(n-1))] (full jitter).
	BackoffBase time.Duration `envconfig:"NOTIFY_BACKOFF_BASE" default:"500ms" desc:"first retry waits up to this"`
	BackoffMax  time.Duration `envconfig:"NOTIFY_BACKOFF_MAX" default:"30s" desc:"no retry waits longer"`
	// Workers is how many events are delivered concurrently.
	Workers int `envconfig:"NOTIFY_WORKERS" default:"4" desc:"events delivered concurrently; 1 keeps stream order"`
	// MetricsAddr is where Run serves /metrics and /healthz (the caller
	// listens on it and passes the listener in Deps.Metrics).
	MetricsAddr string `envconfig:"NOTIFY_METRICS_ADDR" desc:"serve /metrics and /healthz here; empty = off"`
}

// The consumer's settings that are no configuration: fixed, except where a
// test shortens them through TestHooks.
const (
	maxAckPending   = 64
	defaultAckWait  = 30 * time.Second
	defaultPollWait = time.Second
)

// MaxAckPending caps the consumer's unacknowledged messages: 64, or one
// per worker when there are more.
func (c Config) MaxAckPending() int { return max(maxAckPending, c.Workers) }

// durableName is what NATS accepts as a consumer name, kept conservative.
var durableName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Validate reports the first invalid value as one sentence.
func (c Config) Validate() error {
	if c.URL != "" {
		u, err := url.Parse(string(c.URL))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("ALLOT_NOTIFY_URL must be an absolute http:// or https:// URL, got %q", c.URL.String())
		}
	}
	if err := validFilter(c.Filter); err != nil {
		return err
	}
	if !durableName.MatchString(c.Durable) {
		return fmt.Errorf("ALLOT_NOTIFY_DURABLE must be 1 to 64 letters, digits, '-' or '_', got %q", c.Durable)
	}
	if c.Timeout <= 0 || c.Timeout > 10*time.Minute {
		return fmt.Errorf("ALLOT_NOTIFY_TIMEOUT must be above 0 and at most 10m, got %s", c.Timeout)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 1000 {
		return fmt.Errorf("ALLOT_NOTIFY_MAX_ATTEMPTS must be between 1 and 1000, got %d", c.MaxAttempts)
	}
	if c.BackoffBase <= 0 {
		return fmt.Errorf("ALLOT_NOTIFY_BACKOFF_BASE must be above 0, got %s", c.BackoffBase)
	}
	if c.BackoffMax < c.BackoffBase || c.BackoffMax > time.Hour {
		return fmt.Errorf("ALLOT_NOTIFY_BACKOFF_MAX must be between ALLOT_NOTIFY_BACKOFF_BASE (%s) and 1h, got %s", c.BackoffBase, c.BackoffMax)
	}
	if c.Workers < 1 || c.Workers > 256 {
		return fmt.Errorf("ALLOT_NOTIFY_WORKERS must be between 1 and 256, got %d", c.Workers)
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return fmt.Errorf("ALLOT_NOTIFY_METRICS_ADDR must be host:port or :port, got %q", c.MetricsAddr)
		}
	}
	return nil
}

// validFilter accepts NATS subjects within alloc.evt.>, separated by
// commas: whole-token wildcards only, '>' last.
func validFilter(filter string) error {
	promoted := wire.EventSubjectPrefix + "*." + string(wire.EventPromoted)
	bad := fmt.Errorf("ALLOT_NOTIFY_FILTER must be subjects within %s> such as %s or %s,%s*.%s, got %q",
		wire.EventSubjectPrefix, promoted, promoted, wire.EventSubjectPrefix, wire.EventExpired, filter)
	parts := strings.Split(filter, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
		if validSubject(parts[i]) != nil || slices.Index(parts, parts[i]) < i {
			return bad
		}
	}
	return nil
}

// validSubject accepts one NATS subject within alloc.evt.>.
func validSubject(f string) error {
	bad := errors.New("not a subject within " + wire.EventSubjectPrefix + ">")
	if !strings.HasPrefix(f, wire.EventSubjectPrefix) {
		return bad
	}
	tokens := strings.Split(f, ".")
	for i, tok := range tokens {
		switch {
		case tok == "", strings.ContainsAny(tok, " \t\r\n"):
			return bad
		case tok == ">" && i != len(tokens)-1:
			return bad
		case tok != "*" && tok != ">" && strings.ContainsAny(tok, "*>"):
			return bad
		}
	}
	return nil
}

// SecretURL is a webhook URL that prints with its password and query values
// masked: webhook URLs often carry their credentials.
type SecretURL string

func (u SecretURL) String() string {
	if u == "" {
		return ""
	}
	p, err := url.Parse(string(u))
	if err != nil {
		return "*****"
	}
	if q := p.Query(); len(q) > 0 {
		for k := range q {
			q[k] = []string{"*****"}
		}
		p.RawQuery = q.Encode()
	}
	return p.Redacted()
}
