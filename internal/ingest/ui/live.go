package ui

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/wire"
)

// Names of the messages of the live feed (the SSE "event:" field). Every
// message's data is one line of JSON.
const (
	// MsgState carries a State: first on connect, then at most every
	// SnapshotEvery while events flow and every IdleEvery when idle.
	MsgState = "state"
	// MsgEvent carries one wire.Event of the activity, exactly as
	// ALLOT_EVENTS holds it, in stream order.
	MsgEvent = "event"
	// MsgWarning carries {"warning": sentence} when a state read failed;
	// the stream goes on and the next snapshot retries.
	MsgWarning = "warning"
	// MsgBye carries {"reason": sentence} right before the server ends the
	// stream because it is shutting down.
	MsgBye = "bye"
)

// retryMillis is the reconnection delay suggested to EventSource.
const retryMillis = 3000

// maxBatch bounds the events written between two flushes.
const maxBatch = 512

// ServeLive serves GET /v1/activities/{activity}/live, the server-sent
// events of one activity: its state on connect, then each of its events
// from ALLOT_EVENTS as they are published, and fresh states. It returns
// when the client leaves, when Config.Done closes, or on a write error.
func (s *Server) ServeLive(w http.ResponseWriter, r *http.Request, activity int64) {
	if r.Method == http.MethodHead {
		setStreamHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		return
	}
	select {
	case s.slots <- struct{}{}:
	default:
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, msgTooMany)
		return
	}
	defer func() { <-s.slots }()
	s.clients.Add(1)
	defer s.clients.Add(-1)

	ctx := r.Context()
	log := s.cfg.Log.With(slog.Int64("activity_id", activity))

	// The consumer exists before the first state is read, so that no event
	// falls between the state and the feed; one may be in both, which is
	// harmless because states, not events, carry the numbers.
	feed := make(chan []byte, s.cfg.Buffer)
	var skipped atomic.Uint64
	cons, cc, err := s.consume(ctx, activity, func(m jetstream.Msg) {
		select {
		case feed <- m.Data():
		default:
			skipped.Add(1)
		}
	})
	if err != nil {
		if ctx.Err() == nil {
			log.WarnContext(ctx, "live: start the event consumer", slog.Any("err", err))
		}
		writeError(w, http.StatusServiceUnavailable, msgBrokerDown)
		return
	}
	defer s.stopConsumer(ctx, log, cons, cc)

	e := s.snaps.acquire(activity)
	defer s.snaps.release(activity, e)
	st, lastSent, err := s.snapshot(ctx, e, activity, time.Now())
	if err != nil {
		if ctx.Err() == nil {
			log.ErrorContext(ctx, "live: read activity", slog.Any("err", err))
		}
		if _, ok := errors.AsType[*ShardError](err); ok {
			w.Header().Set("Retry-After", "5")
			writeError(w, http.StatusServiceUnavailable, dbDown(err, "try again shortly."))
		} else {
			writeError(w, http.StatusServiceUnavailable, msgDatabaseDown)
		}
		return
	}

	setStreamHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	// The server's WriteTimeout covers the whole response; each flush
	// pushes the deadline forward instead. (Its ReadTimeout does not end
	// the stream: net/http clears the read deadline once the request is
	// read.)
	out := &stream{w: w, rc: http.NewResponseController(w), timeout: s.cfg.WriteTimeout}
	out.buf.WriteString("retry: " + strconv.Itoa(retryMillis) + "\n\n")
	out.message(MsgState, st)
	if out.flush() != nil {
		return
	}

	// lastSent is when the reads of the last state sent began.
	tick := time.NewTicker(s.cfg.SnapshotEvery)
	defer tick.Stop()
	var (
		lastSnap  = time.Now()
		lastEvent time.Time
		dirty     bool // events were sent that the last state may not include
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.cfg.Done:
			out.message(MsgBye, map[string]string{"reason": "The server is shutting down; the page reconnects by itself."})
			out.flush() // ending anyway
			return
		case data := <-feed:
			out.event(data)
		drain:
			for range maxBatch - 1 {
				select {
				case data := <-feed:
					out.event(data)
				default:
					break drain
				}
			}
			lastEvent, dirty = time.Now(), true
			if out.flush() != nil {
				return
			}
		case now := <-tick.C:
			if !dirty && now.Sub(lastSnap) < s.cfg.IdleEvery {
				continue
			}
			// A read shared with the other pages of the activity will do if
			// it began within the last tick: while events flow, MySQL sees
			// about one read per tick per activity, however many pages
			// watch. The stream stays dirty until a state whose read began
			// after the last event has gone out, so the final numbers of a
			// burst show within two ticks of its last event.
			st, started, err := s.snapshot(ctx, e, activity, now.Add(-s.cfg.SnapshotEvery))
			if err == nil && started.Equal(lastSent) && now.Sub(lastSnap) < s.cfg.IdleEvery {
				continue // the shared read this page already has
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				log.WarnContext(ctx, "live: read activity", slog.Any("err", err))
				out.message(MsgWarning, map[string]string{"warning": dbDown(err, "the numbers shown may be stale.")})
			} else {
				st.Skipped = skipped.Load()
				out.message(MsgState, st)
				dirty, lastSent = started.Before(lastEvent), started
			}
			lastSnap = now
			if out.flush() != nil {
				return
			}
		}
	}
}

// consume starts an ordered consumer of activity's events, delivering only
// events published from now on to handle.
func (s *Server) consume(ctx context.Context, activity int64, handle jetstream.MessageHandler) (jetstream.Consumer, jetstream.ConsumeContext, error) {
	var b [6]byte
	rand.Read(b[:])
	cctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	cons, err := s.cfg.JS.OrderedConsumer(cctx, wire.EventStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.EventSubjectPrefix + strconv.FormatInt(activity, 10) + ".>"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		// A consumer left behind by a crashed ingest goes away by itself;
		// stopConsumer deletes it at once in every other case.
		InactiveThreshold: 30 * time.Second,
		NamePrefix:        "allot_live_" + hex.EncodeToString(b[:]),
	})
	if err != nil {
		return nil, nil, err
	}
	cc, err := cons.Consume(handle)
	if err != nil {
		s.deleteConsumer(cons) //nolint:errcheck // the Consume error is the one to report
		return nil, nil, err
	}
	return cons, cc, nil
}

// stopConsumer stops delivery and deletes the server-side consumer, which
// an ordered consumer's Stop leaves to its inactivity threshold.
func (s *Server) stopConsumer(ctx context.Context, log *slog.Logger, cons jetstream.Consumer, cc jetstream.ConsumeContext) {
	cc.Stop()
	if err := s.deleteConsumer(cons); err != nil {
		log.DebugContext(ctx, "live: delete the event consumer", slog.Any("err", err))
	}
}

func (s *Server) deleteConsumer(cons jetstream.Consumer) error {
	info := cons.CachedInfo()
	if info == nil {
		return nil
	}
	// The request's context is usually over by now: the client left.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.cfg.JS.DeleteConsumer(ctx, wire.EventStream, info.Name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	return err
}

func setStreamHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache, no-store")
	h.Set("X-Accel-Buffering", "no") // tell nginx-style proxies not to buffer
	h.Set("X-Content-Type-Options", "nosniff")
}

// stream buffers SSE messages and writes them in one go, pushing the
// connection's write deadline forward before each write.
type stream struct {
	w       io.Writer
	rc      *http.ResponseController
	timeout time.Duration
	buf     bytes.Buffer
}

// message appends one message with v as its JSON data.
func (o *stream) message(name string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		return // only this package's plain types are encoded here
	}
	o.raw(name, data)
}

// event appends one event as it came from the stream. The allocator writes
// compact JSON; anything else is compacted (SSE data ends at a newline) or,
// when not JSON at all, dropped.
func (o *stream) event(data []byte) {
	if bytes.ContainsAny(data, "\r\n") {
		var c bytes.Buffer
		if json.Compact(&c, data) != nil {
			return
		}
		data = c.Bytes()
	} else if !json.Valid(data) {
		return
	}
	o.raw(MsgEvent, data)
}

func (o *stream) raw(name string, data []byte) {
	o.buf.WriteString("event: ")
	o.buf.WriteString(name)
	o.buf.WriteString("\ndata: ")
	o.buf.Write(data)
	o.buf.WriteString("\n\n")
}

func (o *stream) flush() error {
	defer o.buf.Reset()
	if err := o.rc.SetWriteDeadline(time.Now().Add(o.timeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	if _, err := o.w.Write(o.buf.Bytes()); err != nil {
		return err
	}
	return o.rc.Flush()
}
