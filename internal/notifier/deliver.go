package notifier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/client"
)

// Errors that decide how a failed delivery ends.
var (
	// ErrPermanent marks a webhook answer that retrying cannot change: a
	// 4xx other than 408 (timeout), 409 (conflict, e.g. the same key still
	// in progress), 425 (too early) and 429 (rate limit). The event is
	// dead-lettered at once. Match it with errors.Is.
	ErrPermanent = errors.New("the webhook rejected the event")
	// ErrMalformedEvent means the message is not an event: not a JSON
	// object, or without a usable event_id. It is dead-lettered at once.
	// It is client.ErrMalformedEvent, which receivers match too.
	ErrMalformedEvent = client.ErrMalformedEvent
	// ErrAttemptsExhausted means every attempt of a delivery failed.
	ErrAttemptsExhausted = errors.New("delivery attempts exhausted")
)

// StatusError is a webhook answer outside 2xx.
type StatusError struct {
	StatusCode int
	// Body is the start of the answer, for the log and the dead letter.
	Body string
	// RetryAfter is the receiver's Retry-After, 0 when absent.
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("webhook answered %d", e.StatusCode)
	}
	return fmt.Sprintf("webhook answered %d: %s", e.StatusCode, e.Body)
}

// Is makes errors.Is(err, ErrPermanent) true for the statuses retrying
// cannot fix.
func (e *StatusError) Is(target error) bool {
	return target == ErrPermanent && permanentStatus(e.StatusCode)
}

func permanentStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return code >= 400 && code < 500
}

// maxErrorBody is how much of a failed answer is kept.
const maxErrorBody = 512

// decodeEvent checks that data is an event a receiver can dedupe, with
// the public decoder webhook receivers use too.
func decodeEvent(data []byte) (client.Event, error) { return client.DecodeEvent(data) }

// handle delivers one message and ends it: Ack after a 2xx or a stored dead
// letter, Nak when stopping. ctx ends on Stop.
func (n *Notifier) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil { // not a JetStream message: cannot happen on a pull consumer
		n.log.ErrorContext(ctx, "event without metadata", slog.Any("err", err))
		msg.Term() //nolint:errcheck
		return
	}
	seq := meta.Sequence.Stream
	if !n.claim(seq) {
		n.log.DebugContext(ctx, "redelivery of an event in flight here; skipped", slog.Uint64("stream_seq", seq))
		return
	}
	defer n.release(seq)
	stopBeat := n.heartbeat(msg)
	defer stopBeat()
	ctx, endTrace := traceEvent(ctx, msg)
	defer endTrace()

	log := n.log.With(slog.Uint64("stream_seq", seq), slog.String("subject", msg.Subject()),
		slog.Uint64("num_delivered", meta.NumDelivered))
	ev, err := decodeEvent(msg.Data())
	if err != nil {
		log.WarnContext(ctx, "malformed event: dead-lettering it", slog.Any("err", err))
		n.deadLetter(ctx, log, msg, meta, deadLetter{reason: ReasonMalformed, err: err})
		return
	}
	log = log.With(slog.String("event_id", ev.EventID), slog.Int64("activity_id", ev.ActivityID),
		slog.String("kind", string(ev.Kind)))

	if n.cfg.URL == "" {
		log.InfoContext(ctx, "event", slog.Int64("user_id", ev.UserID), slog.String("request_id", ev.RequestID),
			slog.Uint64("seq", ev.Seq), slog.Int("index", ev.Index), slog.Time("at", ev.At))
		if n.ack(ctx, log, msg) {
			n.m.deliveries.WithLabelValues(resultLogged).Inc()
		}
		return
	}

	for attempt := 1; ; attempt++ {
		err := n.post(ctx, ev.EventID, msg.Data())
		if err == nil {
			if attempt > 1 {
				log.InfoContext(ctx, "event delivered after retries", slog.Int("attempts", attempt))
			} else {
				log.DebugContext(ctx, "event delivered")
			}
			if n.ack(ctx, log, msg) {
				n.m.deliveries.WithLabelValues(resultDelivered).Inc()
			}
			return
		}
		if errors.Is(err, ErrPermanent) || attempt >= n.cfg.MaxAttempts {
			reason := ReasonRejected
			if !errors.Is(err, ErrPermanent) {
				reason = ReasonExhausted
				err = fmt.Errorf("%w after %d: %w", ErrAttemptsExhausted, attempt, err)
			}
			log.WarnContext(ctx, "event not delivered: dead-lettering it", slog.Int("attempts", attempt), slog.Any("err", err))
			n.deadLetter(ctx, log, msg, meta, deadLetter{reason: reason, err: err, attempts: attempt})
			return
		}
		wait := n.backoff(attempt, err)
		log.InfoContext(ctx, "webhook attempt failed; retrying", slog.Int("attempt", attempt),
			slog.Duration("wait", wait), slog.Any("err", err))
		if !sleep(ctx, wait) {
			log.InfoContext(ctx, "stopping: event handed back for redelivery", slog.Int("attempts", attempt))
			msg.Nak() //nolint:errcheck // redelivered after AckWait anyway
			return
		}
	}
}

// post makes one webhook attempt. It is not cut short by Stop: the attempt
// in flight finishes (within Timeout) so that a delivered event is acked.
func (n *Notifier) post(ctx context.Context, eventID string, body []byte) (err error) {
	start := time.Now()
	defer func() {
		n.m.attemptSeconds.Observe(time.Since(start).Seconds())
		n.m.attempts.WithLabelValues(attemptOutcome(err)).Inc()
	}()
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, string(n.cfg.URL), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrPermanent, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", eventID)
	req.Header.Set("User-Agent", "allot-notifier")
	req, span := traceWebhook(req)
	defer func() { endWebhook(span, err) }()
	resp, err := n.client.Do(req)
	if err != nil {
		if actx.Err() != nil {
			return fmt.Errorf("webhook timed out after %s: %w", n.cfg.Timeout, context.DeadlineExceeded)
		}
		return fmt.Errorf("webhook: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// Drain so the connection is reused; the answer is already a yes.
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16)) //nolint:errcheck
		return nil
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16)) //nolint:errcheck
	return &StatusError{
		StatusCode: resp.StatusCode,
		Body:       strings.TrimSpace(string(snippet)),
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After")),
	}
}

func attemptOutcome(err error) string {
	var se *StatusError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &se):
		return strconv.Itoa(se.StatusCode/100) + "xx"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	default:
		return "error"
	}
}

// backoff is the wait before attempt+1: the receiver's Retry-After when it
// gave one, else full jitter over the capped exponential; both at most
// BackoffMax.
func (n *Notifier) backoff(attempt int, err error) time.Duration {
	var se *StatusError
	if errors.As(err, &se) && se.RetryAfter > 0 {
		return min(se.RetryAfter, n.cfg.BackoffMax)
	}
	return Backoff(attempt, n.cfg.BackoffBase, n.cfg.BackoffMax)
}

// Backoff returns a random duration in [0, min(ceiling, base·2^(attempt-1))]:
// exponential backoff with full jitter, so that many events failing together
// do not retry in lockstep.
func Backoff(attempt int, base, ceiling time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or bad.
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// ack acknowledges msg and waits for the broker to confirm, so that a lost
// ack is seen (and logged) rather than assumed. A failed ack means one more
// delivery later, which the receiver dedupes.
func (n *Notifier) ack(ctx context.Context, log *slog.Logger, msg jetstream.Msg) bool {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := msg.DoubleAck(actx); err != nil {
		log.WarnContext(ctx, "ack failed: the event will be redelivered", slog.Any("err", err))
		return false
	}
	return true
}

// heartbeat tells JetStream every AckWait/3 that msg is still being worked
// on, until the returned function is called.
func (n *Notifier) heartbeat(msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(n.hooks.ackWait() / 3)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				msg.InProgress() //nolint:errcheck // a missed beat means at most one redelivery
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-finished }
}

func (n *Notifier) claim(seq uint64) bool {
	n.inFlight.mu.Lock()
	defer n.inFlight.mu.Unlock()
	if _, ok := n.inFlight.seqs[seq]; ok {
		return false
	}
	n.inFlight.seqs[seq] = struct{}{}
	return true
}

func (n *Notifier) release(seq uint64) {
	n.inFlight.mu.Lock()
	delete(n.inFlight.seqs, seq)
	n.inFlight.mu.Unlock()
}
