package allocator

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/allot-dev/allot/internal/allocator/members"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// TestPartitionOfMatchesTheServer: the allocator's idea of an activity's
// partition is the stream transform's.
func TestPartitionOfMatchesTheServer(t *testing.T) {
	t.Parallel()
	ns := natstest.New(t)
	_, js := ns.Connect(t)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js, natstest.Config(7)); err != nil {
		t.Fatal(err)
	}
	st, _ := js.Stream(ctx, wire.RequestStream)
	for a := int64(1); a <= 300; a++ {
		ack, err := js.Publish(ctx, wire.RequestSubject(a), []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		if want := bus.StoredSubject(a, 7); m.Subject != want {
			t.Fatalf("activity %d stored on %s, bus.StoredSubject says %s", a, m.Subject, want)
		}
	}
	// The number of partitions cannot change under a running system.
	if err := bus.EnsureStreams(ctx, js, natstest.Config(3)); err == nil {
		t.Fatal("re-partitioning an existing stream was accepted")
	}
	if err := bus.EnsureStreams(ctx, js, natstest.Config(7)); err != nil {
		t.Fatalf("the same partitions again: %v", err)
	}
}

// process is one allocator process: its own connection, one allocator per
// partition.
type process struct {
	nc  *nats.Conn
	all []*Allocator
}

func (e *env) startProcess(partitions int, cfg Config, d Deps) *process {
	e.t.Helper()
	nc, _ := e.ns.Connect(e.t)
	p := &process{nc: nc}
	cfg.Partitions = partitions
	d.DB, d.NATS, d.Log = e.db.DB, nc, e.log
	for i := range partitions {
		d.Partition = i
		a, err := New(cfg, d)
		if err != nil {
			e.t.Fatal(err)
		}
		if err := a.Start(context.Background()); err != nil {
			e.t.Fatal(err)
		}
		p.all = append(p.all, a)
	}
	e.t.Cleanup(p.stop)
	return p
}

func (p *process) stop() {
	for _, a := range p.all {
		a.Stop()
	}
}

// kill drops the process's connection without a goodbye, as kill -9 would,
// then reaps its goroutines.
func (p *process) kill() {
	p.nc.Close()
	p.stop()
}

// TestTwoAllocatorsOverFourPartitions: two allocator processes compete for
// four partitions; pins are forced off mid-burst, then one process dies.
// Every request is applied exactly once, in order, with exactly one event
// per change, and the audit replays it clean.
func TestTwoAllocatorsOverFourPartitions(t *testing.T) {
	t.Parallel()
	const partitions = 4
	e := &env{t: t, db: dbtest.New(t), ns: natstest.New(t), log: discardLog()}
	e.nc, e.js = e.ns.Connect(t)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, e.js, natstest.Config(partitions)); err != nil {
		t.Fatal(err)
	}
	cfg := conf(func(k *Config) { k.PinnedTTL = time.Second; k.BatchSize = 50 })
	d := Deps{Test: TestHooks{AckWait: 2 * time.Second}}
	a := e.startProcess(partitions, cfg, d)
	b := e.startProcess(partitions, cfg, d)

	reqs := mixedBurst(3000, 12, 8, 60)
	var (
		mu   sync.Mutex
		last uint64
	)
	stop := make(chan struct{})
	var (
		wg        sync.WaitGroup
		unpinned  int                // unpins the server carried out
		unpinErrs = map[string]int{} // the others, by error
	)
	wg.Add(1)
	go func() { // force unpins while the burst runs
		defer wg.Done()
		st, err := e.js.Stream(ctx, wire.RequestStream)
		if err != nil {
			unpinErrs[err.Error()]++
			return
		}
		for {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
				if err := st.UnpinConsumer(ctx, bus.AllocatorConsumer(rand.IntN(partitions)), bus.PriorityGroup); err != nil {
					unpinErrs[err.Error()]++ // e.g. no client pinned at that moment
				} else {
					unpinned++
				}
			}
		}
	}()
	for i, r := range reqs {
		seq := e.publish(r, "")
		mu.Lock()
		last = max(last, seq)
		mu.Unlock()
		if i == len(reqs)/2 {
			a.kill()
		}
	}
	close(stop)
	wg.Wait()
	// The fault took effect: pins were really forced off mid-burst.
	if unpinned < partitions {
		t.Fatalf("%d unpins carried out during the burst, want at least %d; failed: %v", unpinned, partitions, unpinErrs)
	}
	t.Logf("forced unpins: %d carried out, failed: %v", unpinned, unpinErrs)
	waitApplied(t, e, len(reqs), 15*time.Second)
	_ = b

	e.db.CheckInvariants(t)
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request"); n != int64(len(reqs)) {
		t.Fatalf("results = %d, want %d", n, len(reqs))
	}
	checkEvents(t, e)
	rep, err := audit.Run(ctx, audit.Config{}, audit.Deps{DB: e.db.DB, JS: e.js})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		var lines []string
		for _, d := range rep.Divergences {
			lines = append(lines, d.String())
		}
		t.Fatalf("audit found %d divergences:\n%s", len(rep.Divergences), strings.Join(lines, "\n"))
	}
}

// waitApplied waits until n requests have results.
func waitApplied(t *testing.T, e *env, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := e.db.Count(t, "SELECT COUNT(*) FROM processed_request")
		if got >= int64(n) {
			return
		}
		if time.Now().After(deadline) {
			diagnose(t, e, 4)
			t.Fatalf("%d of %d requests applied after %s", got, n, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkEvents compares ALLOT_EVENTS, deduplicated by event_id, with the
// events every result row says its request caused.
func checkEvents(t *testing.T, e *env) {
	t.Helper()
	want := map[string]int{}
	total := 0
	rows, err := e.db.Query("SELECT request_id, events FROM processed_request WHERE events IS NOT NULL")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, enc string
		if err := rows.Scan(&id, &enc); err != nil {
			t.Fatal(err)
		}
		evs, err := store.DecodeEvents(enc)
		if err != nil {
			t.Fatal(err)
		}
		for i, ev := range evs {
			want[wire.EventID(id, i)+" "+string(ev.Kind)]++
			total++
		}
	}
	rows.Close()
	deadline := time.Now().Add(30 * time.Second)
	for natstest.StreamMsgs(t, e.js, wire.EventStream) < uint64(total) {
		if time.Now().After(deadline) {
			t.Fatalf("event stream holds %d events, want at least %d", natstest.StreamMsgs(t, e.js, wire.EventStream), total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c, err := e.js.OrderedConsumer(context.Background(), wire.EventStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	seen := map[string]string{}
	for len(seen) < total {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var ev wire.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				t.Fatal(err)
			}
			if prev, ok := seen[ev.EventID]; ok {
				if prev != string(m.Data()) {
					t.Fatalf("event %s published twice with different content", ev.EventID)
				}
				continue
			}
			seen[ev.EventID] = string(m.Data())
			got[ev.EventID+" "+string(ev.Kind)]++
		}
		if n == 0 {
			break
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events on the stream (%d) differ from the committed changes (%d)", len(got), total)
	}
}

// TestEventsMatchResultsByKind: after a mixed burst, the events on
// ALLOT_EVENTS, counted by kind, are exactly what the recorded outcomes
// imply: one per changed signup, none missing, none doubled.
func TestEventsMatchResultsByKind(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reqs := mixedBurst(2500, 4, 10, 50)
	var last uint64
	for _, r := range reqs {
		last = e.publish(r, "")
	}
	e.start(conf(nil), TestHooks{})
	e.waitFence(last)

	want := map[wire.EventKind]int{}
	capacity := map[int64]int64{}
	rows, err := e.db.Query("SELECT activity_id, outcome, promoted_user_ids, capacity FROM processed_request ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var (
			act      int64
			outcome  wire.Outcome
			promoted *string
			cap      *int64
		)
		if err := rows.Scan(&act, &outcome, &promoted, &cap); err != nil {
			t.Fatal(err)
		}
		switch outcome {
		case wire.OutcomeOpened:
			want[wire.EventOpened]++
		case wire.OutcomeResized:
			if *cap != capacity[act] {
				want[wire.EventResized]++
			}
		case wire.OutcomeConfirmed:
			want[wire.EventConfirmed]++
		case wire.OutcomeWaiting:
			want[wire.EventWaitlisted]++
		case wire.OutcomeGranted:
			want[wire.EventGranted]++
		case wire.OutcomeCancelled:
			want[wire.EventCancelled]++
		}
		if promoted != nil {
			var ids []int64
			if err := json.Unmarshal([]byte(*promoted), &ids); err != nil {
				t.Fatal(err)
			}
			want[wire.EventPromoted] += len(ids)
		}
		if cap != nil {
			capacity[act] = *cap
		}
	}
	rows.Close()

	got := map[wire.EventKind]int{}
	ids := map[string]bool{}
	c, err := e.js.OrderedConsumer(context.Background(), wire.EventStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var ev wire.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				t.Fatal(err)
			}
			if ids[ev.EventID] {
				t.Fatalf("event %s delivered twice", ev.EventID)
			}
			ids[ev.EventID] = true
			got[ev.Kind]++
		}
		soldOut := got[wire.EventSoldOut]
		delete(got, wire.EventSoldOut)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			if soldOut == 0 {
				t.Fatal("no sold_out event in a burst that fills activities")
			}
			for _, k := range []wire.EventKind{wire.EventOpened, wire.EventConfirmed, wire.EventWaitlisted, wire.EventGranted, wire.EventCancelled, wire.EventPromoted, wire.EventResized} {
				if want[k] == 0 {
					t.Fatalf("the burst produced no %s event; make it richer", k)
				}
			}
			return
		}
		got[wire.EventSoldOut] = soldOut
		if time.Now().After(deadline) {
			delete(got, wire.EventSoldOut)
			t.Fatalf("events by kind %v, want %v (from the results)", got, want)
		}
	}
}

// TestPartitionsSpreadOverProcesses: two allocator processes with
// membership split four partitions two and two, each partition pinned to
// the process that prefers it; when one process leaves, the other takes
// every partition over and the burst is applied exactly once.
func TestPartitionsSpreadOverProcesses(t *testing.T) {
	t.Parallel()
	const partitions = 4
	e := &env{t: t, db: dbtest.New(t), ns: natstest.New(t), log: discardLog()}
	e.nc, e.js = e.ns.Connect(t)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, e.js, natstest.Config(partitions)); err != nil {
		t.Fatal(err)
	}
	join := func() (*members.Members, func()) {
		m, err := members.Join(ctx, e.js, e.log, 100*time.Millisecond, bus.MembersTTL)
		if err != nil {
			t.Fatal(err)
		}
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			m.Run(mctx) //nolint:errcheck // it returns nil
		}()
		var once sync.Once
		leave := func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(leave)
		return m, leave
	}
	ma, leaveA := join()
	mb, _ := join()
	// Both see both before pulling, so neither grabs everything first.
	deadline := time.Now().Add(5 * time.Second)
	for !(ma.Prefers(0) != mb.Prefers(0) && ma.Prefers(1) != mb.Prefers(1)) {
		if time.Now().After(deadline) {
			t.Fatal("the two members never saw each other")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The pin outlives a stall of a loaded machine (CI runs every
	// package at once): with a second, the other process took a partition
	// over while its own process was merely slow.
	cfg := conf(func(k *Config) { k.PinnedTTL = 5 * time.Second })
	test := TestHooks{AckWait: 2 * time.Second}
	a := e.startProcess(partitions, cfg, Deps{Prefers: ma.Prefers, Test: test})
	b := e.startProcess(partitions, cfg, Deps{Prefers: mb.Prefers, Test: test})

	reqs := mixedBurst(1500, 16, 8, 60)
	for _, r := range reqs[:len(reqs)/2] {
		e.publish(r, "")
	}
	waitApplied(t, e, len(reqs)/2, 30*time.Second)

	// Who applied what: each partition only by the process that prefers
	// it, and each process two partitions.
	held := map[*process]int{}
	for p := range partitions {
		var appliers []*process
		for _, pr := range []*process{a, b} {
			if applied(pr.all[p]) > 0 {
				appliers = append(appliers, pr)
			}
		}
		if len(appliers) != 1 {
			t.Fatalf("partition %d applied by %d processes, want 1", p, len(appliers))
		}
		if !appliers[0].all[p].prefers() {
			t.Errorf("partition %d applied by a process that does not prefer it", p)
		}
		held[appliers[0]]++
	}
	if held[a] != 2 || held[b] != 2 {
		t.Fatalf("partitions applied: %d and %d, want 2 and 2", held[a], held[b])
	}

	// One process leaves: the other takes its partitions over.
	a.stop()
	leaveA()
	for _, r := range reqs[len(reqs)/2:] {
		e.publish(r, "")
	}
	waitApplied(t, e, len(reqs), 30*time.Second)
	e.db.CheckInvariants(t)
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request"); n != int64(len(reqs)) {
		t.Fatalf("results = %d, want %d", n, len(reqs))
	}
}

// applied is how many requests an allocator applied: the sum of its
// batch-size histogram.
func applied(a *Allocator) float64 {
	var m dto.Metric
	if err := a.m.batchSize.Write(&m); err != nil {
		return 0
	}
	return m.GetHistogram().GetSampleSum()
}
