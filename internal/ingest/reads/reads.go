// Package reads routes ingest's MySQL reads to the shard that holds them:
// an activity's state and signups to its partition's shard (the map in
// KV bucket ALLOT_SHARDS, watched, through shards.Router), a request's
// result to the shard of the partition its id names. It keeps a
// cached ping of every shard (Probe) for /readyz, /metrics and the
// operator page, and turns a failed read into a ShardError that names
// the shard. With one shard every read goes to its pool, as before the
// map existed. See docs/shards.md.
package reads

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store/waitlist"
)

// Metrics are the per-shard series; ingest registers them.
type Metrics struct {
	// Up is 1 while the shard answers a ping, 0 while it does not, by
	// shard; set by every Probe.
	Up *prometheus.GaugeVec
	// Errors counts reads that failed, by shard.
	Errors *prometheus.CounterVec
}

// Shard is one shard as ingest reads it: its name, its pool and the signup
// reads with their cached positions.
type Shard struct {
	Name      string
	DB        *sql.DB
	Positions *waitlist.Positions

	probe  probe
	errors prometheus.Counter
}

// Reads routes reads over the shards' pools. Create it with New; with
// several shards, Start before routing.
type Reads struct {
	byName map[string]*Shard
	all    []*Shard // sorted by name
	m      Metrics

	router atomic.Pointer[shards.Router]
	parts  atomic.Int64 // partitions of the request stream; 0 before Start
	stop   context.CancelFunc
	mu     sync.Mutex // guards stop
}

// New routes over pools (by shard name; at least one). probeTimeout
// bounds one ping. It does no I/O.
func New(pools shards.Pools, probeTimeout time.Duration, m Metrics) (*Reads, error) {
	if len(pools) == 0 {
		return nil, errors.New("ingest: no database to read")
	}
	r := &Reads{byName: map[string]*Shard{}, m: m}
	for _, name := range pools.Names() {
		db := pools[name]
		sh := &Shard{Name: name, DB: db, Positions: waitlist.NewPositions(db),
			probe: probe{db: db, timeout: probeTimeout}}
		if m.Errors != nil {
			sh.errors = m.Errors.WithLabelValues(name)
		}
		if m.Up != nil {
			sh.probe.up = m.Up.WithLabelValues(name)
		}
		r.byName[name] = sh
		r.all = append(r.all, sh)
	}
	if len(pools) == 1 {
		// One shard: every partition is on it, map or no map.
		rt, err := shards.NewRouter(pools, nil)
		if err != nil {
			return nil, err
		}
		r.router.Store(rt)
	}
	return r, nil
}

// Single reports whether there is one shard only (ALLOT_MYSQL_SHARDS
// unset, or naming one): reads then go where they went before shards.
func (r *Reads) Single() bool { return len(r.all) == 1 }

// Start learns the request stream's partitions and, with several shards,
// loads the shard map and watches it until Stop: a partition the map
// moves is read on its new shard from then on.
func (r *Reads) Start(ctx context.Context, js jetstream.JetStream, partitions int, log *slog.Logger) error {
	r.parts.Store(int64(max(partitions, 1)))
	if r.Single() {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop != nil {
		return nil // loaded by an earlier attempt
	}
	wctx, cancel := context.WithCancel(context.Background())
	// The watch outlives this call: the map is followed until Stop.
	rt, err := loadRouter(ctx, wctx, js, r.pools(), log)
	if err != nil {
		cancel()
		return err
	}
	r.router.Store(rt)
	r.stop = cancel
	return nil
}

// loadRouter is shards.Load with the watch on wctx and the first read
// bounded by ctx.
func loadRouter(ctx, wctx context.Context, js jetstream.JetStream, pools shards.Pools, log *slog.Logger) (*shards.Router, error) {
	type res struct {
		rt  *shards.Router
		err error
	}
	ch := make(chan res, 1)
	go func() {
		rt, err := shards.Load(wctx, js, pools, log)
		ch <- res{rt, err}
	}()
	select {
	case x := <-ch:
		if x.err == nil {
			return x.rt, nil
		}
		if _, err := js.KeyValue(ctx, shards.Bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, x.err // several shards and no map: `allotctl setup` is the fix, not a retry
		}
		return nil, fmt.Errorf("%w: %w", bus.ErrUnavailable, x.err)
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: read the shard map: %w", bus.ErrUnavailable, ctx.Err())
	}
}

// Stop ends the map's watch.
func (r *Reads) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop != nil {
		r.stop()
	}
}

func (r *Reads) pools() shards.Pools {
	out := shards.Pools{}
	for _, sh := range r.all {
		out[sh.Name] = sh.DB
	}
	return out
}

// Partitions is the request stream's partitions (1 before Start).
func (r *Reads) Partitions() int { return int(max(r.parts.Load(), 1)) }

// Shards are every shard, sorted by name.
func (r *Reads) Shards() []*Shard { return r.all }

// Partition is the shard that holds partition p now.
func (r *Reads) Partition(p int) (*Shard, error) {
	rt := r.router.Load()
	if rt == nil {
		return nil, errors.New("ingest has not read the shard map yet")
	}
	route, err := rt.Route(p)
	if err != nil {
		return nil, err
	}
	sh, ok := r.byName[route.Shard]
	if !ok { // Route checks the pools; kept for safety
		return nil, fmt.Errorf("partition %d is on shard %q, which ALLOT_MYSQL_SHARDS does not name", p, route.Shard)
	}
	return sh, nil
}

// Activity is the shard that holds activity's state now: that of its
// partition (bus.PartitionOf).
func (r *Reads) Activity(activity int64) (*Shard, error) {
	return r.Partition(bus.PartitionOf(activity, r.Partitions()))
}

// ShardError is a read that failed on a shard: the shard does not answer,
// or no shard could be told for the read (Shard "").
type ShardError struct {
	Shard string
	// Single is set when there is one shard: the answer is then the one
	// of a deployment without shards.
	Single bool
	Err    error
}

func (e *ShardError) Error() string {
	if e.Shard == "" {
		return e.Err.Error()
	}
	return "shard " + e.Shard + ": " + e.Err.Error()
}

func (e *ShardError) Unwrap() error { return e.Err }

// Fail records that a read on sh failed with err (counted, unless ctx,
// the caller's, ended: then the caller left) and returns err as a
// ShardError naming sh.
func (r *Reads) Fail(ctx context.Context, sh *Shard, err error) error {
	if ctx.Err() == nil && sh.errors != nil {
		sh.errors.Inc()
	}
	return &ShardError{Shard: sh.Name, Single: r.Single(), Err: err}
}

// Unrouted is the ShardError of a read whose shard cannot be told (the map
// names a shard this ingest does not know, or has no entry).
func (r *Reads) Unrouted(err error) error {
	return &ShardError{Single: r.Single(), Err: err}
}

// State is one shard and whether it answered its last ping.
type State struct {
	Name string `json:"name"`
	Up   bool   `json:"up"`
}

// Probe pings every shard at once (each ping's answer is kept for a
// second, and pings of one shard never overlap: a flood of probes costs a
// shard one ping a second) and returns their states, sorted by name.
func (r *Reads) Probe(ctx context.Context) []State {
	out := make([]State, len(r.all))
	var wg sync.WaitGroup
	for i, sh := range r.all {
		wg.Go(func() {
			out[i] = State{Name: sh.Name, Up: sh.probe.check(ctx) == nil}
		})
	}
	wg.Wait()
	return out
}

// probe pings one shard, its answer kept for a second.
type probe struct {
	db      *sql.DB
	timeout time.Duration
	up      prometheus.Gauge // nil: none

	mu  sync.Mutex
	at  time.Time
	err error
}

func (p *probe) check(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.at.IsZero() && time.Since(p.at) < time.Second {
		return p.err
	}
	pctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	err := p.db.PingContext(pctx)
	if err != nil && ctx.Err() != nil {
		return err // the caller went away: no answer to keep
	}
	p.at, p.err = time.Now(), err
	if p.up != nil {
		if err == nil {
			p.up.Set(1)
		} else {
			p.up.Set(0)
		}
	}
	return err
}
