package shards

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the replicated KV bucket of the partition → shard map; its
// configuration is bus.ShardsBucketConfig.
const Bucket = "ALLOT_SHARDS"

// keyPrefix starts every key: p.<partition>.
const keyPrefix = "p."

// Key is partition p's key in Bucket.
func Key(p int) string { return keyPrefix + strconv.Itoa(p) }

// movePrefix starts the key of a move's record (move.<partition>), which
// `allotctl shards move` keeps in Bucket while it moves a partition: the
// map's readers and watchers pass over it.
const movePrefix = "move."

// MoveKey is the key of partition p's move record in Bucket.
func MoveKey(p int) string { return movePrefix + strconv.Itoa(p) }

// isMove reports whether key is a move record's, not the map's.
func isMove(key string) bool { return strings.HasPrefix(key, movePrefix) }

// partitionOf reads a key back; ok is false for a key that is not p.<n>.
func partitionOf(key string) (int, bool) {
	s, ok := strings.CutPrefix(key, keyPrefix)
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 0 || strconv.Itoa(p) != s {
		return 0, false
	}
	return p, true
}

// Entry is one partition's value in Bucket, stored as JSON
// {"shard":"s1","epoch":1}: the shard holding the partition's state and
// the ownership epoch, raised by one at each move.
type Entry struct {
	Shard string `json:"shard"`
	Epoch uint64 `json:"epoch"`
}

// Placement is an Entry with the KV revision it was read at, the one
// Update compares against.
type Placement struct {
	Partition int
	Entry
	Revision uint64
}

func decode(e jetstream.KeyValueEntry) (Placement, error) {
	p, ok := partitionOf(e.Key())
	if !ok {
		return Placement{}, fmt.Errorf("bucket %s holds key %q, not p.<partition>", Bucket, e.Key())
	}
	var v Entry
	if err := json.Unmarshal(e.Value(), &v); err != nil || v.Shard == "" || v.Epoch == 0 {
		return Placement{}, fmt.Errorf("bucket %s key %s holds %q, not {\"shard\":...,\"epoch\":n>0}", Bucket, e.Key(), e.Value())
	}
	return Placement{Partition: p, Entry: v, Revision: e.Revision()}, nil
}

// Seed puts partition p mod len(names) on names[p mod len(names)], epoch
// 1, for every partition that has no entry yet (KV Create). An existing
// entry is never overwritten, so running it again, or with another number
// of shards, changes nothing already there. It returns how many entries it
// created.
func Seed(ctx context.Context, kv jetstream.KeyValue, partitions int, names []string) (int, error) {
	if len(names) == 0 {
		names = []string{DefaultName}
	}
	created := 0
	for p := range partitions {
		v, _ := json.Marshal(Entry{Shard: names[p%len(names)], Epoch: 1})
		_, err := kv.Create(ctx, Key(p), v)
		switch {
		case err == nil:
			created++
		case errors.Is(err, jetstream.ErrKeyExists):
		default:
			return created, fmt.Errorf("seed %s %s: %w", Bucket, Key(p), err)
		}
	}
	return created, nil
}

// Read returns every partition's placement, by partition.
func Read(ctx context.Context, kv jetstream.KeyValue) ([]Placement, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", Bucket, err)
	}
	var keys []string
	for k := range lister.Keys() {
		if !isMove(k) {
			keys = append(keys, k)
		}
	}
	var out []Placement
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s %s: %w", Bucket, k, err)
		}
		pl, err := decode(e)
		if err != nil {
			return nil, err
		}
		out = append(out, pl)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	return out, nil
}

// Get returns partition p's placement; jetstream.ErrKeyNotFound (wrapped)
// when the map has no entry for it.
func Get(ctx context.Context, kv jetstream.KeyValue, p int) (Placement, error) {
	e, err := kv.Get(ctx, Key(p))
	if err != nil {
		return Placement{}, fmt.Errorf("read %s %s: %w", Bucket, Key(p), err)
	}
	return decode(e)
}

// ErrStale means an Update lost: the entry changed since the revision it
// was given. Read again and decide again.
var ErrStale = errors.New("the shard map changed since it was read")

// Update sets partition p to e only if its entry is still at revision
// (compare-and-set), and returns the new revision. The epoch must grow.
func Update(ctx context.Context, kv jetstream.KeyValue, p int, e Entry, revision uint64) (uint64, error) {
	if e.Shard == "" || e.Epoch == 0 {
		return 0, fmt.Errorf("shard map entry for partition %d needs a shard and an epoch > 0", p)
	}
	v, _ := json.Marshal(e)
	rev, err := kv.Update(ctx, Key(p), v, revision)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("partition %d at revision %d: %w", p, revision, ErrStale)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return 0, fmt.Errorf("partition %d at revision %d: %w", p, revision, ErrStale)
	}
	if err != nil {
		return 0, fmt.Errorf("update %s %s: %w", Bucket, Key(p), err)
	}
	return rev, nil
}

// Map is an in-memory copy of the shard map that a watch keeps current.
type Map struct {
	mu      sync.RWMutex
	entries map[int]Placement
	changed chan struct{} // closed and replaced at each change
	err     error
	done    chan struct{}
}

// Watch reads the map and keeps it current until ctx ends. It returns
// once the initial values are in.
func Watch(ctx context.Context, kv jetstream.KeyValue) (*Map, error) {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", Bucket, err)
	}
	m := &Map{entries: map[int]Placement{}, changed: make(chan struct{}), done: make(chan struct{})}
	initial := make(chan struct{})
	go func() {
		defer close(m.done)
		defer w.Stop() //nolint:errcheck // the watch ends with ctx
		inited := false
		for {
			select {
			case <-ctx.Done():
				if !inited {
					close(initial)
				}
				return
			case e, ok := <-w.Updates():
				if !ok {
					if !inited {
						close(initial)
					}
					return
				}
				if e == nil { // the initial values are all in
					if !inited {
						inited = true
						close(initial)
					}
					continue
				}
				m.apply(e)
			}
		}
	}()
	select {
	case <-initial:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := m.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Map) apply(e jetstream.KeyValueEntry) {
	if isMove(e.Key()) {
		return // a move's record: not the map's
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		if p, ok := partitionOf(e.Key()); ok {
			delete(m.entries, p)
		}
	} else if pl, err := decode(e); err != nil {
		m.err = err
	} else {
		m.entries[pl.Partition] = pl
	}
	close(m.changed)
	m.changed = make(chan struct{})
}

// Get is partition p's placement; ok is false when the map has none.
func (m *Map) Get(p int) (Placement, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	pl, ok := m.entries[p]
	return pl, ok
}

// Shard is the shard partition p lives on, "" when the map has no entry.
func (m *Map) Shard(p int) string { pl, _ := m.Get(p); return pl.Shard }

// Epoch is partition p's ownership epoch, 0 when the map has no entry.
func (m *Map) Epoch(p int) uint64 { pl, _ := m.Get(p); return pl.Epoch }

// Changed is closed at the next change of the map.
func (m *Map) Changed() <-chan struct{} {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.changed
}

// Err is the last entry the watch could not read (a value not in the
// format), nil when every one was.
func (m *Map) Err() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.err
}

// Done is closed when the watch has ended (its context ended).
func (m *Map) Done() <-chan struct{} { return m.done }
