package bench

import (
	"context"
	"database/sql"
	"fmt"
	dto "github.com/prometheus/client_model/go"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/wire"
)

// ChurnResult is what a view churn run measured.
type ChurnResult struct {
	Activities int
	Drain      time.Duration
	// BucketMsgs and BucketBytes are the view bucket's size once the views
	// settled after the drain; SettledMsgs once cleared views had time to
	// expire (Settle).
	BucketMsgs, BucketBytes uint64
	SettledMsgs             uint64
	// Read is how long reading the whole bucket takes (what an ingest
	// start reads); Takeover how long a new allocator takes from Start to
	// the end of its first view rebuild.
	Read, Takeover time.Duration
	// Dropped is the views the first allocator dropped (not written).
	Dropped float64
}

// ViewChurn fills and empties n activities of capacity 1 (one claim, then
// one cancel each, the claims applied in batches before the cancels so
// that every activity is full, with a view, before it is emptied), then
// measures the view bucket and a takeover. settle is how long to wait for
// cleared views to leave the bucket before counting again.
func ViewChurn(ctx context.Context, db *sql.DB, nc *nats.Conn, log *slog.Logger, n int, cfg allocator.Config, settle time.Duration) (ChurnResult, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return ChurnResult{}, err
	}
	if err := bus.EnsureStreams(ctx, js, config.Defaults[bus.Config]()); err != nil {
		return ChurnResult{}, err
	}
	now := time.Now().UTC()
	bl := &backlog{js: js}
	id := func() string { return uuid.Must(uuid.NewV7()).String() }
	one := int64(1)
	for _, op := range []wire.Op{wire.OpOpen, wire.OpClaim, wire.OpCancel} {
		for a := 1; a <= n; a++ {
			r := wire.Request{RequestID: id(), Op: op, ActivityID: int64(a), UserID: 1, ReceivedAt: now}
			if op == wire.OpOpen {
				r.UserID, r.Capacity = 0, &one
			}
			if err := bl.add(r); err != nil {
				return ChurnResult{}, err
			}
		}
	}
	if err := bl.wait(); err != nil {
		return ChurnResult{}, err
	}
	last, err := lastSeq(ctx, js)
	if err != nil {
		return ChurnResult{}, err
	}
	areg := prometheus.NewRegistry()
	a, err := allocator.New(cfg, allocator.Deps{DB: db, NATS: nc, Log: log, Registerer: areg})
	if err != nil {
		return ChurnResult{}, err
	}
	start := time.Now()
	if err := a.Start(ctx); err != nil {
		return ChurnResult{}, err
	}
	if err := waitFence(ctx, db, 0, last, 30*time.Minute); err != nil {
		a.Stop()
		return ChurnResult{}, err
	}
	res := ChurnResult{Activities: n, Drain: time.Since(start)}
	// The views settle: the bucket stops changing.
	st, err := js.Stream(ctx, bus.KeyValueStream(wire.ViewBucket))
	if err != nil {
		a.Stop()
		return res, err
	}
	var prev uint64 = 1<<64 - 1
	for {
		info, err := st.Info(ctx)
		if err != nil {
			a.Stop()
			return res, err
		}
		if info.State.LastSeq == prev && gauge(areg, "allot_allocator_views_pending") == 0 {
			res.BucketMsgs, res.BucketBytes = info.State.Msgs, info.State.Bytes
			break
		}
		prev = info.State.LastSeq
		time.Sleep(time.Second)
	}
	res.Dropped = counter(areg, "allot_allocator_views_dropped_total")
	a.Stop()
	if settle > 0 {
		time.Sleep(settle)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return res, err
	}
	res.SettledMsgs = info.State.Msgs

	kv, err := js.KeyValue(ctx, wire.ViewBucket)
	if err != nil {
		return res, err
	}
	t0 := time.Now()
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return res, err
	}
	for e := range w.Updates() {
		if e == nil {
			break
		}
	}
	w.Stop() //nolint:errcheck
	res.Read = time.Since(t0)

	// A takeover: a new allocator of the partition, timed to the end of
	// its first rebuild.
	reg := prometheus.NewRegistry()
	// A quick look for work once idle (a seam otherwise only tests use).
	b, err := allocator.New(cfg, allocator.Deps{DB: db, NATS: nc, Log: log, Registerer: reg,
		Test: allocator.TestHooks{IdleCheck: 50 * time.Millisecond}})
	if err != nil {
		return res, err
	}
	t0 = time.Now()
	if err := b.Start(ctx); err != nil {
		return res, err
	}
	defer b.Stop()
	for counter(reg, "allot_allocator_view_rebuilds_total") < 1 {
		if time.Since(t0) > 5*time.Minute {
			return res, fmt.Errorf("no view rebuild within 5 minutes")
		}
		time.Sleep(time.Millisecond)
	}
	res.Takeover = time.Since(t0)
	return res, nil
}

// counter sums the values of the counter name in reg.
func counter(reg *prometheus.Registry, name string) float64 {
	return metricSum(reg, name, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// gauge sums the values of the gauge name in reg.
func gauge(reg *prometheus.Registry, name string) float64 {
	return metricSum(reg, name, func(m *dto.Metric) float64 { return m.GetGauge().GetValue() })
}

// metricSum sums value over the series of the metric name in reg.
func metricSum(reg *prometheus.Registry, name string, value func(*dto.Metric) float64) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += value(m)
		}
	}
	return sum
}
