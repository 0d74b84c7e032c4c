package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
)

// MembersBucket is the KV bucket where allocator processes announce
// themselves, so that partitions spread over the live ones.
const MembersBucket = bus.MembersBucket

// Members spreads partitions over the allocator processes that are alive.
// Each process puts a key in MembersBucket every beat; keys expire after
// ttl. Partition p's preferred owner is live[p mod len(live)] of the sorted
// member ids: every process computes the same answer, and the partitions
// split as evenly as they can. The server's pin still decides who applies;
// preference only decides who pulls, and MySQL's fence covers any overlap
// while membership changes.
type Members struct {
	kv   jetstream.KeyValue
	id   string
	log  *slog.Logger
	beat time.Duration
	ttl  time.Duration

	mu   sync.RWMutex
	view memberView
	live []string

	stop chan struct{}
	done chan struct{}
}

// JoinMembers announces this process and keeps its view of the live ones.
// The bucket must exist with keys that expire after ttl
// (bus.MembersBucketConfig; `allotctl setup` creates it with bus.MembersTTL).
func JoinMembers(ctx context.Context, js jetstream.JetStream, log *slog.Logger, beat, ttl time.Duration) (*Members, error) {
	kv, err := bus.CheckBucket(ctx, js, bus.MembersBucketConfig(1, ttl))
	if err != nil {
		return nil, err
	}
	m := &Members{kv: kv, id: uuid.NewString(), log: log, beat: beat, ttl: ttl, view: memberView{}, stop: make(chan struct{}), done: make(chan struct{})}
	if err := m.refresh(ctx); err != nil {
		return nil, err
	}
	go m.run()
	return m, nil
}

// ID is this process's member id.
func (m *Members) ID() string { return m.id }

func (m *Members) run() {
	defer close(m.done)
	t := time.NewTicker(m.beat)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			m.kv.Delete(ctx, m.id) //nolint:errcheck // it expires anyway
			cancel()
			return
		case <-t.C:
		}
		// A refresh may take longer than a beat under load; it only has
		// to finish before this process's key would expire.
		ctx, cancel := context.WithTimeout(context.Background(), m.ttl/2)
		if err := m.refresh(ctx); err != nil {
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
	if _, err := m.kv.Put(ctx, m.id, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		return err
	}
	listing, err := m.list(ctx)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.live = m.view.merge(m.id, listing)
	return nil
}

// list reads every member key's latest state: true for a live key, false
// for a deleted one. It fails unless it read the bucket to the end.
func (m *Members) list(ctx context.Context) (map[string]bool, error) {
	w, err := m.kv.WatchAll(ctx, jetstream.MetaOnly())
	if err != nil {
		return nil, err
	}
	defer w.Stop() //nolint:errcheck // nothing to do about it
	listing := map[string]bool{}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("allocator membership: listing closed before its end")
			}
			if e == nil { // the marker after the last existing key
				return listing, nil
			}
			listing[e.Key()] = e.Operation() == jetstream.KeyValuePut
		case <-ctx.Done():
			return nil, fmt.Errorf("allocator membership: listing cut short: %w", ctx.Err())
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
	return m.live[p%len(m.live)] == m.id
}

// Leave removes this process's key, so that the others take its
// partitions over at once.
func (m *Members) Leave() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
}
