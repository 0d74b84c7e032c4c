// Package bench measures allot against the designs a user would otherwise
// build, in one run on one machine: the allocator draining a backlog, and
// the seed designs (internal/baseline) under the same load.
package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/wire"
)

// DrainConfig describes one drain run.
type DrainConfig struct {
	Requests   int              // join or claim requests (after one open per activity)
	Activities int              // spread over this many activities
	Capacity   int64            // of each activity
	Op         wire.Op          // wire.OpJoin or wire.OpClaim
	Users      int              // distinct users (0 = one per request)
	Allocator  allocator.Config // the zero Config: the defaults
	// Batch is how many requests for one activity one message carries,
	// as ingest's group commit stores a burst (at most wire.MaxBatch; 0
	// or 1: one request per message).
	Batch int
	// AfterStart, when set, runs once the allocator has started, before
	// the drain is waited for (a benchmark freezes a bucket there).
	AfterStart func()
}

// DrainResult is what a drain run measured.
type DrainResult struct {
	Decisions int
	Elapsed   time.Duration
}

// PerSecond is the drain rate.
func (r DrainResult) PerSecond() float64 { return float64(r.Decisions) / r.Elapsed.Seconds() }

// Drain pre-publishes the requests to the stream (db and nc must be empty of
// allot state), then starts an allocator and times it until the fence has
// passed the last request.
func Drain(ctx context.Context, db *sql.DB, nc *nats.Conn, log *slog.Logger, cfg DrainConfig) (DrainResult, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return DrainResult{}, err
	}
	if err := bus.EnsureStreams(ctx, js, config.Defaults[bus.Config]()); err != nil {
		return DrainResult{}, err
	}
	if err := publishBacklog(js, cfg); err != nil {
		return DrainResult{}, err
	}
	last, err := lastSeq(ctx, js)
	if err != nil {
		return DrainResult{}, err
	}
	total := cfg.Requests + cfg.Activities

	a, err := allocator.New(allocatorConfig(cfg.Allocator), allocator.Deps{DB: db, NATS: nc, Log: log})
	if err != nil {
		return DrainResult{}, err
	}
	start := time.Now()
	if err := a.Start(ctx); err != nil {
		return DrainResult{}, err
	}
	defer a.Stop()
	if cfg.AfterStart != nil {
		cfg.AfterStart()
	}
	if err := waitFence(ctx, db, 0, last, 5*time.Minute); err != nil {
		return DrainResult{}, err
	}
	return DrainResult{Decisions: total, Elapsed: time.Since(start)}, nil
}

// publishBacklog stores cfg's requests in the request stream, one open per
// activity first, and returns once every one is stored.
func publishBacklog(js jetstream.JetStream, cfg DrainConfig) error {
	now := time.Now().UTC()
	bl := &backlog{js: js, batch: max(cfg.Batch, 1), open: map[int64][][]byte{}}
	publish := bl.add
	id := func() string { return uuid.Must(uuid.NewV7()).String() }
	for a := 1; a <= cfg.Activities; a++ {
		c := cfg.Capacity
		if err := publish(wire.Request{RequestID: id(), Op: wire.OpOpen, ActivityID: int64(a), Capacity: &c, ReceivedAt: now}); err != nil {
			return err
		}
	}
	users := cfg.Users
	if users <= 0 {
		users = cfg.Requests
	}
	for i := 0; i < cfg.Requests; i++ {
		r := wire.Request{RequestID: id(), Op: cfg.Op, ActivityID: int64(i%cfg.Activities) + 1,
			UserID: int64(i%users) + 1, ReceivedAt: now}
		if err := publish(r); err != nil {
			return err
		}
	}
	if err := bl.flush(); err != nil {
		return err
	}
	return bl.wait()
}

// backlog publishes requests ahead of an allocator, asynchronously,
// staying below the async publish bound: batch requests of one activity
// to a message (a request batch, as ingest's group commit stores them)
// or, with batch 1, each on its own.
type backlog struct {
	js    jetstream.JetStream
	batch int
	open  map[int64][][]byte // per activity, the requests of its next batch
	sent  int
}

func (b *backlog) add(r wire.Request) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if b.batch <= 1 || r.Op == wire.OpOpen {
		// An open goes alone, ahead of its activity's requests.
		return b.publish(wire.RequestSubject(r.ActivityID), data, r.RequestID, 0)
	}
	b.open[r.ActivityID] = append(b.open[r.ActivityID], data)
	if len(b.open[r.ActivityID]) < b.batch {
		return nil
	}
	return b.flushActivity(r.ActivityID)
}

// flush publishes every batch still open.
func (b *backlog) flush() error {
	for a := range b.open {
		if err := b.flushActivity(a); err != nil {
			return err
		}
	}
	return nil
}

func (b *backlog) flushActivity(a int64) error {
	reqs := b.open[a]
	delete(b.open, a)
	if len(reqs) == 0 {
		return nil
	}
	// A batch, even of one request: its body is an array.
	return b.publish(wire.RequestSubject(a), wire.EncodeBatch(reqs), uuid.Must(uuid.NewV7()).String(), len(reqs))
}

// publish stores one message: a single request (n 0) or a batch of n.
func (b *backlog) publish(subject string, data []byte, msgID string, n int) error {
	if b.sent++; b.sent%2000 == 0 {
		select {
		case <-b.js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			return fmt.Errorf("pre-publish stalled")
		}
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	if n > 0 {
		msg.Header.Set(wire.BatchHeader, strconv.Itoa(n))
	}
	_, err := b.js.PublishMsgAsync(msg, jetstream.WithMsgID(msgID))
	return err
}

// wait returns once every request added is stored.
func (b *backlog) wait() error {
	select {
	case <-b.js.PublishAsyncComplete():
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("pre-publish did not complete within a minute")
	}
}

// allocatorConfig is c, or the allocator's defaults when c is the zero
// Config (a caller that sets nothing gets what a deployment gets).
func allocatorConfig(c allocator.Config) allocator.Config {
	if c == (allocator.Config{}) {
		return config.Defaults[allocator.Config]()
	}
	return c
}
