package move

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/shards"
)

// TestMoveLease: a run holds the move's record with its owner and a
// lease it renews: a second run while it runs is refused (ErrLeased) with
// one sentence naming the owner and when the lease ends, also after more
// than a lease's time (it was renewed), and changes nothing. The first
// run's NATS connection then dies (as in a kill -9) while it sits after
// its copy: once its lease has ended unrenewed, the second run takes the
// record over, resumes the move and finishes it. The first, let go on,
// finds its lease lost and stops without touching anything.
func TestMoveLease(t *testing.T) {
	const (
		partitions = 2
		lease      = 600 * time.Millisecond
	)
	e := newEnv(t, 2, partitions)
	all := acts(6)
	e.open(all)
	e.settle()
	ctx := context.Background()

	nc, js := e.ns.Connect(t)
	kv, err := js.KeyValue(ctx, shards.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	copied, hold := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- Run(ctx, Options{Partition: 0, Partitions: partitions, To: "s1", Pools: e.pools, KV: kv, JS: js,
			Settle: time.Second, Lease: lease, Owner: "the first run",
			After: func(step string) error {
				if step == StepCopy {
					close(copied)
					<-hold
				}
				return nil
			}})
	}()
	select {
	case <-copied:
	case err := <-firstDone:
		t.Fatalf("the first run ended before its copy was done: %v", err)
	}
	second := func() (string, error) {
		var out strings.Builder
		err := Run(ctx, Options{Partition: 0, Partitions: partitions, To: "s1", Pools: e.pools, KV: e.kv, JS: e.js,
			Out: &out, Settle: 3 * time.Second, Lease: lease, Owner: "the second run"})
		return out.String(), err
	}
	rec := func() record {
		t.Helper()
		en, err := e.kv.Get(ctx, shards.MoveKey(0))
		if err != nil {
			t.Fatalf("the move's record: %v", err)
		}
		var r record
		if err := json.Unmarshal(en.Value(), &r); err != nil {
			t.Fatal(err)
		}
		r.rev = en.Revision()
		return r
	}
	held := rec()
	if held.Owner != "the first run" || !held.LeaseUntil.After(time.Now()) {
		t.Fatalf("the record while the first run runs: owner %q, lease until %s; want the first run's, live", held.Owner, held.LeaseUntil)
	}
	for _, wait := range []time.Duration{0, 3 * lease} {
		time.Sleep(wait)
		out, err := second()
		if !errors.Is(err, ErrLeased) || !strings.Contains(err.Error(), "the first run") || !strings.Contains(err.Error(), "lease ends at") {
			t.Fatalf("a second run %s after the first took the lease: %v, want ErrLeased naming the first run and its lease's end\n%s", wait, err, out)
		}
		if out != "" {
			t.Errorf("the refused run printed %q", out)
		}
		t.Logf("refused: %v", err)
	}
	if now := rec(); now.Owner != "the first run" || !now.LeaseUntil.After(held.LeaseUntil) || now.State != stateMoving {
		t.Errorf("the record after %s: owner %q, lease until %s (was %s), state %s; want the first run's lease renewed", 3*lease, now.Owner, now.LeaseUntil, held.LeaseUntil, now.State)
	}
	if e.home(0) != 0 {
		t.Fatalf("partition 0 on s%d while the first run holds it before its flip, want s0", e.home(0))
	}

	// The first run's connection dies: its lease is no longer renewed.
	nc.Close()
	refused := 0
	var out string
	for {
		out, err = second()
		if !errors.Is(err, ErrLeased) {
			break
		}
		refused++
		time.Sleep(lease / 10)
	}
	if err != nil {
		t.Fatalf("the second run once the first's lease ended: %v\n%s", err, out)
	}
	if refused == 0 {
		t.Error("the second run was not refused once the first run's connection died: its lease was still live then")
	}
	if !strings.Contains(out, "resume  the move of partition 0") || !strings.Contains(out, "done    partition 0 on s1") {
		t.Errorf("the second run did not resume and finish the move:\n%s", out)
	}
	close(hold)
	if err := <-firstDone; !errors.Is(err, errLeaseLost) {
		t.Errorf("the first run, let go on after its lease ended: %v, want its lease lost", err)
	}
	if pl, err := shards.Get(ctx, e.kv, 0); err != nil || pl.Shard != "s1" || pl.Epoch != 2 {
		t.Fatalf("the map after the second run: %+v, %v; want s1 at epoch 2", pl, err)
	}
	if _, err := e.kv.Get(ctx, shards.MoveKey(0)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the move's record after the move: %v, want none", err)
	}
	e.check()
	if left := e.rowsOf(0, 0); len(left) != 0 {
		t.Errorf("partition 0's rows left on s0: %v", left)
	}
}

// TestMoveLeaseReleased: a run that fails midway (stopped after a step)
// gives its lease up: the next run is not kept waiting and resumes at
// once, and the record it leaves names no owner.
func TestMoveLeaseReleased(t *testing.T) {
	e := newEnv(t, 2, 2)
	e.open(acts(4))
	e.settle()
	ctx := context.Background()
	opts := func(stop string) Options {
		return Options{Partition: 0, Partitions: 2, To: "s1", Pools: e.pools, KV: e.kv, JS: e.js, Settle: time.Second,
			Lease: time.Hour, After: func(step string) error {
				if step == stop {
					return errKilled
				}
				return nil
			}}
	}
	if err := Run(ctx, opts(StepVerify)); !errors.Is(err, errKilled) {
		t.Fatalf("move stopped after verify: %v", err)
	}
	en, err := e.kv.Get(ctx, shards.MoveKey(0))
	if err != nil {
		t.Fatal(err)
	}
	var r record
	if err := json.Unmarshal(en.Value(), &r); err != nil || r.Owner != "" || !r.LeaseUntil.IsZero() {
		t.Errorf("the record after a failed run: %s (%v), want no owner nor lease", en.Value(), err)
	}
	if err := Run(ctx, opts("")); err != nil {
		t.Fatalf("the move run again at once: %v", err)
	}
	if e.home(0) != 1 {
		t.Fatalf("partition 0 on s%d, want s1", e.home(0))
	}
}

// TestMoveLeaseLost: a run whose record is changed under it (another run
// took it over) sees it at its next renewal and stops with its lease
// lost, its step cut; the run that holds the record then finishes the
// move.
func TestMoveLeaseLost(t *testing.T) {
	const lease = 600 * time.Millisecond
	e := newEnv(t, 2, 2)
	e.open(acts(4))
	e.settle()
	ctx := context.Background()
	frozen, hold := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Partition: 0, Partitions: 2, To: "s1", Pools: e.pools, KV: e.kv, JS: e.js, Settle: time.Second,
			Lease: lease, Owner: "the first run", After: func(step string) error {
				if step == StepFreeze {
					close(frozen)
					<-hold
				}
				return nil
			}})
	}()
	select {
	case <-frozen:
	case err := <-done:
		t.Fatalf("the first run ended before its freeze: %v", err)
	}
	// Another run's takeover, as its record write would leave it (lapsed
	// at once, so that the test's run can take it in turn).
	en, err := e.kv.Get(ctx, shards.MoveKey(0))
	if err != nil {
		t.Fatal(err)
	}
	var r record
	if err := json.Unmarshal(en.Value(), &r); err != nil {
		t.Fatal(err)
	}
	r.Owner, r.LeaseUntil = "another run", time.Now().UTC()
	v, _ := json.Marshal(r)
	if _, err := e.kv.Update(ctx, shards.MoveKey(0), v, en.Revision()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease) // past the first run's next renewal
	close(hold)
	if err := <-done; !errors.Is(err, errLeaseLost) {
		t.Fatalf("the first run after its record was taken over: %v, want its lease lost", err)
	}
	if e.home(0) != 0 {
		t.Fatalf("partition 0 on s%d after the first run lost its lease before the flip, want s0", e.home(0))
	}
	var out strings.Builder
	if err := Run(ctx, Options{Partition: 0, Partitions: 2, To: "s1", Pools: e.pools, KV: e.kv, JS: e.js, Out: &out,
		Settle: time.Second, Lease: lease}); err != nil {
		t.Fatalf("the move run again: %v\n%s", err, out.String())
	}
	if e.home(0) != 1 {
		t.Fatalf("partition 0 on s%d, want s1", e.home(0))
	}
	e.check()
}
