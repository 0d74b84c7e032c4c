// Package members spreads the partitions of the request stream over the
// allocator processes that are alive (the ALLOT_ALLOCATORS bucket).
package members

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
)

// Members spreads partitions over the allocator processes that are alive.
// Each process puts a key in bus.MembersBucket every beat; keys expire after
// ttl. Partition p's preferred owner is live[p mod len(live)] of the sorted
// member ids: every process computes the same answer, and the partitions
// split as evenly as they can. The server's pin still decides who applies;
// preference only decides who pulls, and MySQL's fence covers any overlap
// while membership changes.
//
// A member that gave a partition up because it could not commit (the allocator's stall watch)
// names it in its key's value; the partition's preferred owner is then
// picked the same way among the members that did not give it up (all of
// them, when every one did). Every process still computes the same answer.
type Members struct {
	kv   jetstream.KeyValue
	id   string
	log  *slog.Logger
	beat time.Duration
	ttl  time.Duration

	mu   sync.RWMutex
	view memberView
	live []string
	// gaveUp holds, for each live member, the partitions it gave up, as
	// its key last said; mine is this process's own.
	gaveUp map[string][]int
	mine   map[int]bool

	kick chan struct{} // a beat now: mine changed
}

// memberValue is what a member's key holds.
type memberValue struct {
	At time.Time `json:"at"`
	// GaveUp lists the partitions the member gave up for want of commits.
	GaveUp []int `json:"gave_up,omitempty"`
}

// Join announces this process and reads the live ones once; Run keeps
// its view until ctx ends. The bucket must exist with keys that expire
// after ttl (bus.MembersBucketConfig; `allotctl setup` creates it with
// bus.MembersTTL).
func Join(ctx context.Context, js jetstream.JetStream, log *slog.Logger, beat, ttl time.Duration) (*Members, error) {
	kv, err := bus.CheckBucket(ctx, js, bus.MembersBucketConfig(1, ttl))
	if err != nil {
		return nil, err
	}
	m := &Members{kv: kv, id: uuid.NewString(), log: log, beat: beat, ttl: ttl, view: memberView{}, mine: map[int]bool{},
		kick: make(chan struct{}, 1)}
	if err := m.refresh(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// JoinIfThere joins the membership on nc (Join, with the process's beat
// and bus.MembersTTL). Without the membership bucket it returns nil and no
// error: every process then pulls on every partition, which is safe, only
// less even. A bucket not as set up is an error.
func JoinIfThere(ctx context.Context, nc *nats.Conn, log *slog.Logger) (*Members, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil
	}
	m, err := Join(ctx, js, log, time.Second, bus.MembersTTL)
	if bus.IsSetupError(err) {
		return nil, err
	}
	if err != nil {
		log.WarnContext(ctx, "allocator membership unavailable; pulling on every partition", slog.Any("err", err))
		return nil, nil
	}
	return m, nil
}

// ID is this process's member id.
func (m *Members) ID() string { return m.id }

// Run renews this process's key and reads the live ones every beat until
// ctx ends; then it removes the key, so that the others take this
// process's partitions over at once, and returns nil.
func (m *Members) Run(ctx context.Context) error {
	t := time.NewTicker(m.beat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			m.kv.Delete(dctx, m.id) //nolint:errcheck // it expires anyway
			cancel()
			return nil
		case <-t.C:
		case <-m.kick:
		}
		// A refresh may take longer than a beat under load; it only has
		// to finish before this process's key would expire.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.ttl/2)
		if err := m.refresh(rctx); err != nil {
			m.log.Warn("allocator membership", slog.Any("err", err))
		}
		cancel()
	}
}

// refresh renews this process's key and reads the live ones.
//
// A view is only ever replaced by a complete listing: one cut short by its
// deadline or a dropped connection is an error and the old view stays.
// Even a complete listing can miss a key that was rewritten while it ran
// (the server may count the rewrite as the listing's last entry), so a
// member leaves the view only when its key is deleted (a graceful leave)
// or when it has been missing from missesToLeave listings in a row (its
// key expired). This process is always in its own view: it just wrote its
// key. Without these rules a slow listing under load made a process see
// only the others, stop pulling and hand its partitions over.
func (m *Members) refresh(ctx context.Context) error {
	m.mu.RLock()
	v := memberValue{At: time.Now().UTC().Truncate(time.Second)}
	for p := range m.mine {
		v.GaveUp = append(v.GaveUp, p)
	}
	m.mu.RUnlock()
	slices.Sort(v.GaveUp)
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := m.kv.Put(ctx, m.id, b); err != nil {
		return err
	}
	listing, gaveUp, err := m.list(ctx)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.live = m.view.merge(m.id, listing)
	// A member missing from this listing but still in the view keeps
	// what its key said last.
	for id := range m.gaveUp {
		if _, ok := listing[id]; !ok && slices.Contains(m.live, id) {
			gaveUp[id] = m.gaveUp[id]
		}
	}
	m.gaveUp = gaveUp
	return nil
}

// list reads every member key's latest state: true for a live key, false
// for a deleted one, and the partitions each live one gave up. It fails
// unless it read the bucket to the end.
func (m *Members) list(ctx context.Context) (map[string]bool, map[string][]int, error) {
	w, err := m.kv.WatchAll(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer w.Stop() //nolint:errcheck // nothing to do about it
	listing := map[string]bool{}
	gaveUp := map[string][]int{}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, nil, errors.New("allocator membership: listing closed before its end")
			}
			if e == nil { // the marker after the last existing key
				return listing, gaveUp, nil
			}
			put := e.Operation() == jetstream.KeyValuePut
			listing[e.Key()] = put
			var v memberValue
			// An older value (a bare time) gave nothing up.
			if put && json.Unmarshal(e.Value(), &v) == nil && len(v.GaveUp) > 0 {
				gaveUp[e.Key()] = v.GaveUp
			}
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("allocator membership: listing cut short: %w", ctx.Err())
		}
	}
}

// missesToLeave is how many complete listings in a row a member's key must
// be missing from before the member leaves the view.
const missesToLeave = 2

// memberView is what a process remembers of the others between listings:
// how many listings in a row each member has been missing from.
type memberView map[string]int

// merge folds one complete listing into the view and returns the sorted
// live member ids.
func (v memberView) merge(self string, listing map[string]bool) []string {
	for id := range v {
		if _, ok := listing[id]; !ok {
			v[id]++
		}
	}
	for id, alive := range listing {
		if alive {
			v[id] = 0
		} else {
			delete(v, id)
		}
	}
	v[self] = 0
	live := make([]string, 0, len(v))
	for id, misses := range v {
		if misses >= missesToLeave {
			delete(v, id)
			continue
		}
		live = append(live, id)
	}
	slices.Sort(live)
	return live
}

// Prefers reports whether partition p's preferred owner is this process.
// While this process sees no member at all (not even itself), it prefers
// everything: pulling is always safe.
func (m *Members) Prefers(p int) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if len(m.live) == 0 {
		return true
	}
	return preferred(m.live, p, func(id string) bool {
		if id == m.id {
			return m.mine[p]
		}
		return slices.Contains(m.gaveUp[id], p)
	}) == m.id
}

// preferred is partition p's preferred owner among live (sorted): picked
// among the members that did not give p up, or among all when every one
// did.
func preferred(live []string, p int, gaveUp func(id string) bool) string {
	cands := make([]string, 0, len(live))
	for _, id := range live {
		if !gaveUp(id) {
			cands = append(cands, id)
		}
	}
	if len(cands) == 0 {
		cands = live
	}
	return cands[p%len(cands)]
}

// GiveUp records that this process gave partition p up (stalled true) or
// takes part in it again (false), and tells the others at once.
func (m *Members) GiveUp(p int, stalled bool) {
	m.mu.Lock()
	if stalled {
		m.mine[p] = true
	} else {
		delete(m.mine, p)
	}
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}
