// Package gauges keeps the allocator's gauges that need a question to the
// broker or the database: the consumer's lag and the outbox backlog.
package gauges

import (
	"context"
	"database/sql"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/allot-dev/allot/internal/store"
)

// period is how often the gauges ask.
const period = 2 * time.Second

// Gauges are one partition's.
type Gauges struct {
	pending prometheus.Gauge
	backlog prometheus.Gauge
}

// New registers the gauges with reg (labelled by the caller).
func New(reg prometheus.Registerer) *Gauges {
	f := promauto.With(reg)
	return &Gauges{
		pending: f.NewGauge(prometheus.GaugeOpts{
			Name: "allot_allocator_consumer_pending_messages", Help: "Requests stored on this partition and not yet acknowledged (the allocator's lag).",
		}),
		backlog: f.NewGauge(prometheus.GaugeOpts{
			Name: "allot_allocator_outbox_backlog_requests", Help: "Applied requests whose events are not yet relayed to ALLOT_EVENTS.",
		}),
	}
}

// Run refreshes the gauges of partition (its consumer cons) every period
// until ctx ends, and returns nil.
func (g *Gauges) Run(ctx context.Context, cons jetstream.Consumer, db *sql.DB, partition int) error {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if info, err := cons.Info(ctx); err == nil {
			g.pending.Set(float64(info.NumPending + uint64(info.NumAckPending)))
		}
		if n, err := store.OutboxBacklog(ctx, db, partition); err == nil {
			g.backlog.Set(float64(n))
		}
	}
}
