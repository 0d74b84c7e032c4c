package audit_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/store/checkpoint"
	"github.com/allot-dev/allot/internal/wire"
)

// setRequestsMaxAge updates the request stream's age limit, as an
// operator's ALLOT_REQUESTS_MAX_AGE does at the next start.
func (e *env) setRequestsMaxAge(age time.Duration) {
	e.t.Helper()
	st, err := e.js.Stream(context.Background(), wire.RequestStream)
	if err != nil {
		e.t.Fatal(err)
	}
	c := natstest.Config(bus.PartitionsOf(st.CachedInfo().Config))
	c.RequestsMaxAge, c.RequestsMaxBytes = age, 64<<20
	c.EventsMaxAge, c.EventsMaxBytes = 0, 0 // no limit
	if err := bus.EnsureStreams(context.Background(), e.js, c); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) streamFirstSeq() uint64 {
	e.t.Helper()
	st, err := e.js.Stream(context.Background(), wire.RequestStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.FirstSeq
}

// newPartitionedEnv is newEnv with a request stream of the given number of
// partitions: newEnv makes a one-partition stream, this starts it over.
func newPartitionedEnv(t testing.TB, partitions int) *env {
	t.Helper()
	e := newEnv(t)
	ctx := context.Background()
	if err := e.js.DeleteStream(ctx, wire.RequestStream); err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, e.js, natstest.Config(partitions)); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestAuditFromCheckpointAfterRetention: the allocator checkpoints its
// state; retention removes every request up to the checkpoint from the
// stream (a full audit now refuses to run), and the audit from the
// checkpoint verifies the rest, says which range, and still reports a
// result tampered after the checkpoint, a live row the checkpoint vouches
// for, and a checkpoint row changed after it was taken (digest mismatch).
func TestAuditFromCheckpointAfterRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.setRequestsMaxAge(2 * time.Second)
	a, err := allocator.New(checkpointing(200*time.Millisecond), allocator.Deps{DB: e.db.DB, NATS: e.nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)

	// Before the checkpoint: three activities with every kind of row.
	before := burst(600, 3, 4, 12, 7)
	seqs := e.publishAll(before)
	ckptSeq := seqs[len(seqs)-1]
	e.waitFence(ckptSeq)
	if cp := e.waitCheckpoint(t, 0, ckptSeq); cp.Activities != 3 || cp.Signups == 0 {
		t.Fatalf("checkpoint at seq %d holds %d activities and %d signups, want 3 and some", cp.Seq, cp.Activities, cp.Signups)
	}
	// Retention removes everything the checkpoint covers.
	for deadline := time.Now().Add(time.Minute); e.streamFirstSeq() <= ckptSeq; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("requests up to %d still stored a minute after their max age", ckptSeq)
		}
	}
	// The age limit goes up again before anything more is published, so
	// that nothing after the checkpoint leaves, however slow the machine.
	e.setRequestsMaxAge(time.Hour)
	// After it: activities 1 and 2 only, so activity 3's rows are as the
	// checkpoint left them.
	var after []wire.Request
	for i, r := range burst(300, 2, 4, 12, 11) {
		if i >= 2 { // not the opens: the activities exist
			after = append(after, r)
		}
	}
	// A repeat of a request applied before the checkpoint (an
	// Idempotency-Key retry stored again after the duplicate window): the
	// allocator skips it, and so must the audit, which never replayed the
	// first one.
	repeat := before[len(before)/2]
	after = append(after[:100], append([]wire.Request{repeat}, after[100:]...)...)
	seqs = e.publishAll(after)
	last := seqs[len(seqs)-1]
	e.waitFence(last)
	if first := e.streamFirstSeq(); first != ckptSeq+1 {
		t.Fatalf("stream starts at %d, want %d (just after the checkpoint)", first, ckptSeq+1)
	}

	if _, err := audit.Run(ctx, audit.Config{}, audit.Deps{DB: e.db.DB, JS: e.js}); !errors.Is(err, audit.ErrIncompleteStream) {
		t.Fatalf("full audit after retention: err %v, want ErrIncompleteStream", err)
	}
	rep := e.audit(audit.Config{FromCheckpoint: true})
	if !rep.OK {
		t.Fatalf("audit from checkpoint of an untouched system diverges:%s", divergences(rep.Divergences))
	}
	if rep.VerifiedFrom != ckptSeq+1 || rep.VerifiedTo != last {
		t.Errorf("verified seq %d..%d, want %d..%d", rep.VerifiedFrom, rep.VerifiedTo, ckptSeq+1, last)
	}
	if len(rep.Checkpoints) != 1 || rep.Checkpoints[0].Seq != ckptSeq || !rep.Checkpoints[0].DigestOK {
		t.Errorf("checkpoints used: %+v, want one at seq %d with its digest ok", rep.Checkpoints, ckptSeq)
	}
	if rep.Compared != len(after)-1 || rep.Skipped != 1 {
		t.Errorf("compared %d requests and skipped %d, want the %d after the checkpoint and the repeat", rep.Compared, rep.Skipped, len(after)-1)
	}
	if rep := e.audit(audit.Config{FromCheckpoint: true, Activities: []int64{1, 3}}); !rep.OK || rep.ActivitiesChecked != 2 {
		t.Errorf("audit from checkpoint of activities 1 and 3: ok %v, %d checked:%s", rep.OK, rep.ActivitiesChecked, divergences(rep.Divergences))
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"verified:             seq ", "from checkpoint:      partition 0 at seq "} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report text lacks %q:\n%s", want, text.String())
		}
	}

	// The allocator is stopped so that nothing moves under the tampering.
	a.Stop()
	check := func(name string, want func(d audit.Divergence) bool) {
		t.Helper()
		rep := e.audit(audit.Config{FromCheckpoint: true})
		for _, d := range rep.Divergences {
			if want(d) {
				return
			}
		}
		t.Errorf("%s: not reported; divergences:%s", name, divergences(rep.Divergences))
	}

	// A result after the checkpoint.
	tampered := seqs[len(seqs)/2]
	e.exec("UPDATE processed_request SET outcome = 'REJECTED' WHERE seq = ?", tampered)
	check("a result tampered after the checkpoint", func(d audit.Divergence) bool {
		return d.Seq == tampered && d.Kind == audit.KindResult && d.Field == "outcome"
	})
	rep = e.audit(audit.Config{FromCheckpoint: true})
	e.exec("UPDATE processed_request SET outcome = ? WHERE seq = ?", wantOutcome(t, rep, tampered), tampered)

	// A live row the checkpoint vouches for: activity 3 is untouched since.
	e.exec("UPDATE activity SET capacity = capacity + 1 WHERE id = 3")
	check("a live row covered by the checkpoint", func(d audit.Divergence) bool {
		return d.Seq == ckptSeq && d.Kind == audit.KindActivity && d.ActivityID == 3 && d.Field == "capacity"
	})
	e.exec("UPDATE activity SET capacity = capacity - 1 WHERE id = 3")
	if rep := e.audit(audit.Config{FromCheckpoint: true}); !rep.OK {
		t.Fatalf("after undoing the tampering:%s", divergences(rep.Divergences))
	}

	// The checkpoint's own rows: the digest no longer matches.
	e.exec("UPDATE allocator_checkpoint_signup SET queue_seq = queue_seq + 100000 WHERE seq = ? AND activity_id = 3 ORDER BY user_id LIMIT 1", ckptSeq)
	rep = e.audit(audit.Config{FromCheckpoint: true})
	if rep.OK || len(rep.Checkpoints) != 1 || rep.Checkpoints[0].DigestOK {
		t.Fatalf("a tampered checkpoint row: ok %v, checkpoints %+v, want a digest mismatch", rep.OK, rep.Checkpoints)
	}
	found := false
	for _, d := range rep.Divergences {
		found = found || d.Kind == audit.KindCheckpoint && d.Field == "digest" && d.Seq == ckptSeq
	}
	if !found {
		t.Errorf("no checkpoint digest divergence:%s", divergences(rep.Divergences))
	}
}

// wantOutcome is the outcome the replay expects at seq, from a report
// that found the tampered one.
func wantOutcome(t *testing.T, rep audit.Report, seq uint64) string {
	t.Helper()
	for _, d := range rep.Divergences {
		if d.Seq == seq && d.Field == "outcome" {
			return d.Expected
		}
	}
	t.Fatalf("no outcome divergence at seq %d", seq)
	return ""
}

// TestFromCheckpointNeedsOne: with the stream cut by retention and no
// checkpoint yet, the audit from checkpoint refuses to run, naming why.
func TestFromCheckpointNeedsOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startAllocator()
	seqs := e.publishAll(burst(50, 2, 3, 5, 3))
	e.waitFence(seqs[len(seqs)-1])
	st, err := e.js.Stream(context.Background(), wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(context.Background(), jetstream.WithPurgeSequence(seqs[10])); err != nil {
		t.Fatal(err)
	}
	_, err = audit.Run(context.Background(), audit.Config{FromCheckpoint: true}, audit.Deps{DB: e.db.DB, JS: e.js})
	if !errors.Is(err, audit.ErrNoCheckpoint) {
		t.Fatalf("err %v, want ErrNoCheckpoint", err)
	}
	if err := (audit.Config{FromCheckpoint: true, FromSeq: 3}).Validate(); !errors.Is(err, audit.ErrInvalidConfig) {
		t.Fatalf("-from-checkpoint with -from-seq: err %v, want ErrInvalidConfig", err)
	}
}

// TestAuditFromCheckpointPartitioned: three partitions, each checkpointed
// at its own fence; the stream is cut just after the lowest one. The audit
// from the checkpoints skips, per partition, what its checkpoint covers
// (also the messages of a partition between the lowest checkpoint and its
// own), replays the rest and is clean.
func TestAuditFromCheckpointPartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const partitions = 3
	e := newPartitionedEnv(t, partitions)
	var allocs []*allocator.Allocator
	start := func(interval time.Duration) {
		for _, a := range allocs {
			a.Stop()
		}
		allocs = allocs[:0]
		for p := range partitions {
			a, err := allocator.New(checkpointingPartitions(interval, partitions), allocator.Deps{DB: e.db.DB, NATS: e.nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Partition: p})
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Start(ctx); err != nil {
				t.Fatal(err)
			}
			allocs = append(allocs, a)
		}
	}
	t.Cleanup(func() {
		for _, a := range allocs {
			a.Stop()
		}
	})
	applied := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); e.db.Count(t, "SELECT COUNT(*) FROM processed_request") < n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d results after a minute", n)
			}
		}
	}
	start(100 * time.Millisecond)
	first := burst(900, 9, 4, 12, 5)
	e.publishAll(first)
	applied(int64(len(first)))
	// Every partition checkpointed at its final fence.
	var fences [partitions]uint64
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		done := 0
		for p := range partitions {
			var fence uint64
			if err := e.db.QueryRow("SELECT last_seq FROM allocator_partition WHERE partition_id = ?", p).Scan(&fence); err != nil {
				t.Fatal(err)
			}
			cp, ok, err := checkpoint.Latest(ctx, e.db.DB, p)
			if err != nil {
				t.Fatal(err)
			}
			if ok && cp.Seq == fence {
				fences[p] = fence
				done++
			}
		}
		if done == partitions {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not every partition checkpointed at its fence within a minute")
		}
	}
	// No more checkpoints: the audit must use these.
	start(-1)
	low := min(fences[0], fences[1], fences[2])
	if low == max(fences[0], fences[1], fences[2]) {
		t.Fatalf("fences %v are all equal: the test needs partitions checkpointed at different seqs", fences)
	}
	st, err := e.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	// As retention would: everything up to the lowest checkpoint leaves.
	if err := st.Purge(ctx, jetstream.WithPurgeSequence(low+1)); err != nil {
		t.Fatal(err)
	}
	var second []wire.Request
	for i, r := range burst(300, 9, 4, 12, 9) {
		if i >= 9 {
			second = append(second, r)
		}
	}
	seqs := e.publishAll(second)
	applied(int64(len(first) + len(second)))

	rep := e.audit(audit.Config{FromCheckpoint: true})
	if !rep.OK {
		t.Fatalf("audit from three checkpoints diverges:%s", divergences(rep.Divergences))
	}
	if len(rep.Checkpoints) != partitions {
		t.Fatalf("checkpoints used: %+v, want one per partition", rep.Checkpoints)
	}
	if rep.VerifiedFrom != low+1 || rep.VerifiedTo != seqs[len(seqs)-1] {
		t.Errorf("verified %d..%d, want %d..%d", rep.VerifiedFrom, rep.VerifiedTo, low+1, seqs[len(seqs)-1])
	}
	if rep.Compared != len(second) {
		t.Errorf("compared %d, want the %d requests after the checkpoints", rep.Compared, len(second))
	}
}

// TestAuditFromCheckpointQuietPartitions: the allocator takes no new
// checkpoint while a partition's fence stands still, so once retention has
// moved past it a quiet partition's newest checkpoint is older than where
// the stream starts, and a partition that never applied anything has none.
// Both still describe the state where the stream starts, and the audit
// from checkpoints uses them instead of refusing.
func TestAuditFromCheckpointQuietPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const partitions = 3
	e := newPartitionedEnv(t, partitions)
	// Activities of partitions 0 and 1; partition 2 gets nothing.
	var acts [2]int64
	for a := int64(1); acts[0] == 0 || acts[1] == 0; a++ {
		if p := bus.PartitionOf(a, partitions); p < 2 && acts[p] == 0 {
			acts[p] = a
		}
	}
	for p := range partitions {
		a, err := allocator.New(checkpointingPartitions(100*time.Millisecond, partitions), allocator.Deps{DB: e.db.DB, NATS: e.nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Partition: p})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Stop)
	}
	// Partition 1 first, then partition 0 last: partition 1's fence, and
	// so its checkpoint, stays below the stream's last sequence.
	seqs := e.publishAll([]wire.Request{openReq(acts[1], 2), newReq(wire.OpJoin, acts[1], 1)})
	quietFence := seqs[len(seqs)-1]
	seqs = e.publishAll([]wire.Request{openReq(acts[0], 2), newReq(wire.OpJoin, acts[0], 1), newReq(wire.OpJoin, acts[0], 2)})
	last := seqs[len(seqs)-1]
	for p, fence := range map[int]uint64{0: last, 1: quietFence} {
		e.waitCheckpoint(t, p, fence)
	}
	// As retention would: everything stored so far leaves.
	st, err := e.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSequence(last+1)); err != nil {
		t.Fatal(err)
	}
	rep := e.audit(audit.Config{FromCheckpoint: true})
	if !rep.OK {
		t.Fatalf("audit from checkpoints with quiet partitions diverges:%s", divergences(rep.Divergences))
	}
	used := map[int]uint64{}
	for _, c := range rep.Checkpoints {
		used[c.Partition] = c.Seq
	}
	if len(used) != 2 || used[0] != last || used[1] != quietFence {
		t.Fatalf("checkpoints used %+v, want partition 0 at %d and partition 1 at %d (partition 2 has none)", rep.Checkpoints, last, quietFence)
	}
	// Tampering with the quiet partition's rows is still caught.
	e.exec("UPDATE activity SET capacity = 3 WHERE id = ?", acts[1])
	if rep := e.audit(audit.Config{FromCheckpoint: true}); rep.OK {
		t.Fatal("a changed row of the quiet partition went unreported")
	}
}

// checkpointing is the allocator's default configuration with checkpoints
// every interval.
func checkpointing(interval time.Duration) allocator.Config {
	return checkpointingPartitions(interval, 1)
}

func checkpointingPartitions(interval time.Duration, partitions int) allocator.Config {
	c := config.Defaults[allocator.Config]()
	c.CheckpointInterval, c.Partitions = interval, partitions
	return c
}
