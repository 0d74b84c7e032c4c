package allocator

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// MembersBucket is the KV bucket where allocator processes announce
// themselves, so that partitions spread over the live ones.
const MembersBucket = "ALLOT_ALLOCATORS"

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

	mu   sync.RWMutex
	live []string

	stop chan struct{}
	done chan struct{}
}

// JoinMembers announces this process and keeps its view of the live ones.
func JoinMembers(ctx context.Context, js jetstream.JetStream, log *slog.Logger, replicas int, beat, ttl time.Duration) (*Members, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      MembersBucket,
		Description: "allot: live allocator processes, for spreading partitions",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.MemoryStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, err
	}
	m := &Members{kv: kv, id: uuid.NewString(), log: log, beat: beat, stop: make(chan struct{}), done: make(chan struct{})}
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
		ctx, cancel := context.WithTimeout(context.Background(), m.beat)
		if err := m.refresh(ctx); err != nil {
			m.log.Warn("allocator membership", slog.Any("err", err))
		}
		cancel()
	}
}

// refresh renews this process's key and reads the live ones.
func (m *Members) refresh(ctx context.Context) error {
	if _, err := m.kv.Put(ctx, m.id, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		return err
	}
	keys, err := m.kv.ListKeys(ctx)
	if err != nil {
		return err
	}
	var live []string
	for k := range keys.Keys() { // drained to the end, the lister cleans up after itself
		live = append(live, k)
	}
	slices.Sort(live)
	m.mu.Lock()
	m.live = live
	m.mu.Unlock()
	return nil
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
