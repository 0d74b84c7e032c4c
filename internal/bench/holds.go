package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// HoldsConfig describes one run of the holds benchmark.
type HoldsConfig struct {
	Holds     int           // holds given at once, and expiring at once
	Hold      time.Duration // the activity's hold (default 2s)
	Allocator allocator.Config
}

// HoldsResult is what a holds run measured, all on one activity and one
// partition, in one run.
type HoldsResult struct {
	Holds int
	// Joins: the Holds joins of the waitlist, drained from a backlog.
	JoinsElapsed time.Duration
	// Scheduled: from the resize that gives every hold (one request) to
	// every expiry scheduled in ALLOT_HOLDS by the outbox relay.
	ScheduleElapsed time.Duration
	// Expiries: from the moment every hold falls due to the last expire
	// applied (its applied_at).
	ExpiryElapsed time.Duration
	// Probes are joins to another activity of the same partition sent
	// while the expiries are applied, each timed from publish to result.
	Probes []time.Duration
}

// JoinsPerSecond is the rate the joins were applied at.
func (r HoldsResult) JoinsPerSecond() float64 { return float64(r.Holds) / r.JoinsElapsed.Seconds() }

// SchedulesPerSecond is the rate the relay scheduled expiries at.
func (r HoldsResult) SchedulesPerSecond() float64 {
	return float64(r.Holds) / r.ScheduleElapsed.Seconds()
}

// ExpiriesPerSecond is the rate the expiries were applied at once due.
func (r HoldsResult) ExpiriesPerSecond() float64 { return float64(r.Holds) / r.ExpiryElapsed.Seconds() }

// ProbeMax is the slowest probe: how long the partition kept another
// activity's request waiting while the expiries were applied.
func (r HoldsResult) ProbeMax() time.Duration {
	if len(r.Probes) == 0 {
		return 0
	}
	return slices.Max(r.Probes)
}

// Holds measures holds at scale: Holds joins wait on an activity of
// capacity 0 with a hold; one resize gives every one of them a seat, held
// until the same instant; then the expiries, which the broker stores when
// due, are applied. Meanwhile a probe joins another activity of the same
// partition every 50ms. db and nc must be empty of allot state.
func Holds(ctx context.Context, db *sql.DB, nc *nats.Conn, log *slog.Logger, cfg HoldsConfig) (HoldsResult, error) {
	res := HoldsResult{Holds: cfg.Holds}
	if cfg.Hold <= 0 {
		cfg.Hold = 2 * time.Second
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return res, err
	}
	if err := bus.EnsureStreams(ctx, js, config.Defaults[bus.Config]()); err != nil {
		return res, err
	}
	const act, probeAct = 1, 2
	id := func() string { return uuid.Must(uuid.NewV7()).String() }
	bl := &backlog{js: js}
	publish := bl.add
	open := func(a, capacity int64, hold time.Duration) wire.Request {
		return wire.Request{RequestID: id(), Op: wire.OpOpen, ActivityID: a, Capacity: &capacity,
			Hold: wire.Duration(hold), ReceivedAt: time.Now().UTC()}
	}
	if err := publish(open(act, 0, cfg.Hold)); err != nil {
		return res, err
	}
	if err := publish(open(probeAct, int64(10*cfg.Holds+1000), 0)); err != nil {
		return res, err
	}
	for u := 1; u <= cfg.Holds; u++ {
		if err := publish(wire.Request{RequestID: id(), Op: wire.OpJoin, ActivityID: act, UserID: int64(u), ReceivedAt: time.Now().UTC()}); err != nil {
			return res, err
		}
	}
	if err := bl.wait(); err != nil {
		return res, err
	}
	last, err := lastSeq(ctx, js)
	if err != nil {
		return res, err
	}

	a, err := allocator.New(allocatorConfig(cfg.Allocator), allocator.Deps{DB: db, NATS: nc, Log: log})
	if err != nil {
		return res, err
	}
	start := time.Now()
	if err := a.Start(ctx); err != nil {
		return res, err
	}
	defer a.Stop()
	if err := waitFence(ctx, db, 0, last, 5*time.Minute); err != nil {
		return res, err
	}
	res.JoinsElapsed = time.Since(start)

	// One resize gives every waiter a seat, held until the same instant.
	resize := open(act, int64(cfg.Holds), cfg.Hold)
	start = time.Now()
	if err := publish(resize); err != nil {
		return res, err
	}
	if err := bl.wait(); err != nil {
		return res, err
	}
	r, err := waitResult(ctx, db, resize.RequestID, 5*time.Minute)
	if err != nil {
		return res, err
	}
	if r.HeldUntil == nil || len(r.PromotedUserIDs) != cfg.Holds {
		return res, fmt.Errorf("the resize held %d seats until %v, want %d", len(r.PromotedUserIDs), r.HeldUntil, cfg.Holds)
	}
	due := wire.HoldDue(*r.HeldUntil)
	holds, err := js.Stream(ctx, wire.HoldStream)
	if err != nil {
		return res, err
	}
	for {
		info, err := holds.Info(ctx)
		if err != nil {
			return res, err
		}
		if info.State.Msgs >= uint64(cfg.Holds) || time.Now().After(due) {
			// Past due, the first schedules fire and leave the stream.
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	res.ScheduleElapsed = time.Since(start)
	if time.Now().After(due) {
		return res, fmt.Errorf("scheduling %d expiries took longer than the %s hold; use a longer hold", cfg.Holds, cfg.Hold)
	}

	// The probes, while the expiries are applied.
	probes := make(chan []time.Duration, 1)
	stop := make(chan struct{})
	go func() {
		var out []time.Duration
		for u := int64(1); ; u++ {
			select {
			case <-stop:
				probes <- out
				return
			case <-time.After(50 * time.Millisecond):
			}
			p := wire.Request{RequestID: id(), Op: wire.OpJoin, ActivityID: probeAct, UserID: u, ReceivedAt: time.Now().UTC()}
			b, _ := json.Marshal(p)
			t0 := time.Now()
			if _, err := js.Publish(ctx, wire.RequestSubject(probeAct), b, jetstream.WithMsgID(p.RequestID)); err != nil {
				continue
			}
			if _, err := waitResult(ctx, db, p.RequestID, time.Minute); err == nil {
				out = append(out, time.Since(t0))
			}
		}
	}()
	var applied int
	var lastApplied time.Time
	for {
		err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(MAX(applied_at), NOW(6)) FROM processed_request WHERE activity_id = ? AND op = 'expire'", act).
			Scan(&applied, &lastApplied)
		if err != nil {
			close(stop)
			return res, err
		}
		if applied >= cfg.Holds {
			break
		}
		if time.Since(due) > 5*time.Minute {
			close(stop)
			return res, fmt.Errorf("%d of %d expiries applied five minutes after they fell due", applied, cfg.Holds)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	res.Probes = <-probes
	res.ExpiryElapsed = lastApplied.Sub(due)
	var expired, held int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND op = 'expire' AND outcome = 'EXPIRED'", act).Scan(&expired); err != nil {
		return res, err
	}
	if err := db.QueryRowContext(ctx, "SELECT held_count FROM activity WHERE id = ?", act).Scan(&held); err != nil {
		return res, err
	}
	if expired != cfg.Holds || held != 0 {
		return res, fmt.Errorf("%d holds expired and %d still held, want %d and 0", expired, held, cfg.Holds)
	}
	return res, nil
}

func lastSeq(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

func waitFence(ctx context.Context, db *sql.DB, partition int, last uint64, within time.Duration) error {
	start := time.Now()
	for {
		var fence uint64
		if err := db.QueryRowContext(ctx, "SELECT last_seq FROM allocator_partition WHERE partition_id = ?", partition).Scan(&fence); err != nil && err != sql.ErrNoRows {
			return err
		}
		if fence >= last {
			return nil
		}
		if time.Since(start) > within {
			return fmt.Errorf("drain stalled at %d of %d", fence, last)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func waitResult(ctx context.Context, db *sql.DB, id string, within time.Duration) (wire.Result, error) {
	start := time.Now()
	for {
		r, ok, err := store.GetResult(ctx, db, id)
		if err != nil || ok {
			return r, err
		}
		if time.Since(start) > within {
			return r, fmt.Errorf("no result for %s within %s", id, within)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
