package shards

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sort"

	"github.com/nats-io/nats.go/jetstream"
)

// Pools are the open pools of the configured shards, by name.
type Pools map[string]*sql.DB

// OpenPools opens a pool for every shard of set with open (store.Open,
// say). On an error it closes those it opened; the error names the shard.
func OpenPools(ctx context.Context, set Set, open func(ctx context.Context, dsn string) (*sql.DB, error)) (Pools, error) {
	out := Pools{}
	for _, sh := range set.Shards() {
		db, err := open(ctx, sh.DSN)
		if err != nil {
			out.Close()
			return nil, fmt.Errorf("shard %s: %w", sh.Name, err)
		}
		out[sh.Name] = db
	}
	return out, nil
}

// Names are the pools' shard names, sorted.
func (ps Pools) Names() []string {
	out := make([]string, 0, len(ps))
	for n := range ps {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Close closes every pool.
func (ps Pools) Close() {
	for _, db := range ps {
		db.Close()
	}
}

// Router answers which shard each partition's state lives on: its name,
// its pool and the partition's ownership epoch, from the watched map. With
// no map (the bucket missing) or no entry for a partition, and exactly one
// shard, the partition is on that shard at epoch 1: a deployment of one
// database set up before the map existed goes on as it did.
type Router struct {
	pools Pools
	m     *Map // nil: no map
	only  string
}

// NewRouter routes over pools with m (nil: no map; then pools must hold
// exactly one shard).
func NewRouter(pools Pools, m *Map) (*Router, error) {
	if len(pools) == 0 {
		return nil, errors.New("shards: no shard to route to")
	}
	r := &Router{pools: pools, m: m}
	if len(pools) == 1 {
		r.only = pools.Names()[0]
	} else if m == nil {
		return nil, fmt.Errorf("the shard map (bucket %s) is missing and ALLOT_MYSQL_SHARDS names %d shards: run `allotctl setup`, which creates and seeds it", Bucket, len(pools))
	}
	return r, nil
}

// Load watches the map in bucket Bucket until ctx ends and routes over
// pools with it. A missing bucket routes every partition to the one shard
// of pools at epoch 1 (logged once), or is an error when there are several.
func Load(ctx context.Context, js jetstream.JetStream, pools Pools, log *slog.Logger) (*Router, error) {
	kv, err := js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		r, err := NewRouter(pools, nil)
		if err == nil {
			log.WarnContext(ctx, "the shard map is missing: every partition is applied on the one shard at epoch 1; `allotctl setup` creates it",
				slog.String("bucket", Bucket), slog.String("shard", r.only))
		}
		return r, err
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", Bucket, err)
	}
	m, err := Watch(ctx, kv)
	if err != nil {
		return nil, err
	}
	return NewRouter(pools, m)
}

// Route is where a partition's transactions go: the shard, its pool and
// the epoch the partition's fence row must be at.
type Route struct {
	Partition int
	Shard     string
	DB        *sql.DB
	Epoch     uint64
}

// Route is partition p's route now. It fails when the map names a shard
// the pools do not hold, or has no entry for p while there are several
// shards.
func (r *Router) Route(p int) (Route, error) {
	name, epoch := r.place(p)
	if name == "" {
		return Route{}, fmt.Errorf("partition %d has no entry in the shard map (bucket %s): run `allotctl setup`, which seeds it", p, Bucket)
	}
	db, ok := r.pools[name]
	if !ok {
		return Route{}, fmt.Errorf("the shard map puts partition %d on shard %q, which ALLOT_MYSQL_SHARDS does not name (it names %v)", p, name, r.pools.Names())
	}
	return Route{Partition: p, Shard: name, DB: db, Epoch: epoch}, nil
}

// Changed is closed at the next change of the map (never without a map):
// a partition's route may have changed.
func (r *Router) Changed() <-chan struct{} {
	if r.m == nil {
		return nil
	}
	return r.m.Changed()
}

// place is p's shard and epoch now ("" and 0: nowhere).
func (r *Router) place(p int) (string, uint64) {
	if r.m != nil {
		if pl, ok := r.m.Get(p); ok {
			return pl.Shard, pl.Epoch
		}
	}
	if r.only != "" {
		return r.only, 1
	}
	return "", 0
}

// Tenure is partition p's tenure on the shard it was routed to: the
// epoch its transactions must find on the fence row, read from the
// watched map at each transaction (no round trip), and whether the map
// has since put p on another shard.
func (r *Router) Tenure(rt Route) *Tenure {
	return &Tenure{r: r, p: rt.Partition, shard: rt.Shard}
}

// Tenure is what an allocator holds of its partition's route; see
// Router.Tenure. The nil *Tenure is a partition that never moves, at epoch
// 1 (an allocator built without a router).
type Tenure struct {
	r     *Router
	p     int
	shard string
}

// Epoch is the map's epoch for the partition now: 1 for a nil Tenure, 0
// (no fence row matches it) when the map no longer names this shard.
func (t *Tenure) Epoch() uint64 {
	if t == nil {
		return 1
	}
	name, epoch := t.r.place(t.p)
	if name != t.shard {
		return 0
	}
	return epoch
}

// Moved reports whether the map now puts the partition on another shard
// than the one it was routed to (never for a nil Tenure).
func (t *Tenure) Moved() bool {
	if t == nil {
		return false
	}
	name, _ := t.r.place(t.p)
	return name != t.shard
}

// Shard is the shard the partition was routed to ("" for a nil Tenure).
func (t *Tenure) Shard() string {
	if t == nil {
		return ""
	}
	return t.shard
}
