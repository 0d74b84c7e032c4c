package notifier

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
)

// The dead-letter stream. ALLOT_EVENTS covers alloc.evt.> only, so the
// dead letters have a stream of their own for alloc.dlq.>.
const (
	DLQStream  = bus.DLQStream
	DLQSubject = "alloc.dlq.notify"
)

// A dead letter's body is the original message, byte for byte (an event's
// JSON, or whatever malformed bytes were on the stream), so that replaying it
// is re-publishing the body on the subject in HeaderSubject. What went wrong
// is in these headers; Nats-Msg-Id is the event_id (or
// "ALLOT_EVENTS:<stream seq>" for a message without one), so a retried
// dead-letter publish is stored once.
const (
	// HeaderReason is one of the Reason constants.
	HeaderReason = "Allot-Dlq-Reason"
	// HeaderError is the last error, one line.
	HeaderError = "Allot-Dlq-Error"
	// HeaderAttempts is how many webhook attempts were made (0 for a
	// malformed event).
	HeaderAttempts = "Allot-Dlq-Attempts"
	// HeaderSubject is the subject the event was published on.
	HeaderSubject = "Allot-Dlq-Subject"
	// HeaderStreamSeq is the event's ALLOT_EVENTS sequence.
	HeaderStreamSeq = "Allot-Dlq-Stream-Seq"
	// HeaderEventID is the event_id, absent for a malformed event without one.
	HeaderEventID = "Allot-Dlq-Event-Id"
	// HeaderConsumer is the durable name of the notifier that gave up.
	HeaderConsumer = "Allot-Dlq-Consumer"
	// HeaderFailedAt is when it gave up, RFC 3339 in UTC.
	HeaderFailedAt = "Allot-Dlq-Failed-At"
)

// Values of HeaderReason.
const (
	// ReasonExhausted: every attempt failed with a retryable error.
	ReasonExhausted = "exhausted"
	// ReasonRejected: the webhook answered with a permanent 4xx.
	ReasonRejected = "rejected"
	// ReasonMalformed: the message is not a deliverable event.
	ReasonMalformed = "malformed"
)

type deadLetter struct {
	reason   string
	err      error
	attempts int
}

// deadLetter stores msg on the dead-letter stream, retrying until JetStream
// confirms or the notifier stops, then acknowledges msg. When stopping first
// it hands msg back (Nak): the next process tries the webhook again.
func (n *Notifier) deadLetter(ctx context.Context, log *slog.Logger, msg jetstream.Msg, meta *jetstream.MsgMetadata, dl deadLetter) {
	out := nats.NewMsg(DLQSubject)
	out.Data = msg.Data()
	out.Header.Set(HeaderReason, dl.reason)
	out.Header.Set(HeaderError, oneLine(dl.err.Error(), 1024))
	out.Header.Set(HeaderAttempts, strconv.Itoa(dl.attempts))
	out.Header.Set(HeaderSubject, msg.Subject())
	out.Header.Set(HeaderStreamSeq, strconv.FormatUint(meta.Sequence.Stream, 10))
	out.Header.Set(HeaderConsumer, n.cfg.Durable)
	out.Header.Set(HeaderFailedAt, time.Now().UTC().Format(time.RFC3339Nano))
	id := meta.Stream + ":" + strconv.FormatUint(meta.Sequence.Stream, 10)
	if ev, err := decodeEvent(msg.Data()); err == nil {
		id = ev.EventID
		out.Header.Set(HeaderEventID, ev.EventID)
	}
	for try := 1; ; try++ {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err := n.js.PublishMsg(pctx, out, jetstream.WithMsgID(id), jetstream.WithExpectStream(DLQStream))
		cancel()
		if err == nil {
			break
		}
		wait := Backoff(try, n.cfg.BackoffBase, n.cfg.BackoffMax)
		log.WarnContext(ctx, "dead-letter publish failed; retrying", slog.Int("try", try),
			slog.Duration("wait", wait), slog.Any("err", err))
		if !sleep(ctx, wait) {
			msg.Nak() //nolint:errcheck // redelivered after AckWait anyway
			return
		}
	}
	if n.ack(ctx, log, msg) {
		n.m.deliveries.WithLabelValues(resultDeadLettered).Inc()
	}
}

// oneLine makes s a valid header value of at most limit bytes.
func oneLine(s string, limit int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > limit {
		s = s[:limit]
	}
	return s
}
