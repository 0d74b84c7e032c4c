package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// TestShardsMoveKilled: the allotctl binary moving partition 0 is killed
// (SIGKILL) after a longer time at each try, and started again, until a
// run finishes by itself: after every kill the map names one shard for the
// partition, whose fence row there is the live one or the frozen old one;
// a run started while the killed one's lease (-lease 1s) is live is
// refused with exit 2 naming the killed process, and one started after it
// ended takes the move over; in the end the partition is on s1, each of
// its activities' rows there only, every request applied once.
func TestShardsMoveKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "allotctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ns := natstest.New(t)
	bases := dbtest.Servers(t, 2)
	dbs := []*dbtest.DB{dbtest.NewOn(t, bases[0]), dbtest.NewOn(t, bases[1])}
	env := append(os.Environ(), "ALLOT_NATS_URL="+ns.URL(), "ALLOT_PARTITIONS=2", "ALLOT_MYSQL_DSN="+dbs[0].DSN,
		"ALLOT_MYSQL_SHARDS=s0="+dbs[0].DSN+",s1="+dbs[1].DSN, "ALLOT_LOG_LEVEL=error")
	nc, js := ns.Connect(t)
	ctx := context.Background()
	if _, err := bus.Setup(ctx, js, natstest.Config(2), []string{"s0", "s1"}); err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults[allocator.Config]()
	cfg.Partitions, cfg.MetricsAddr = 2, ""
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- allocator.Run(rctx, cfg, allocator.Deps{DB: dbs[0].DB, Shards: shards.Pools{"s0": dbs[0].DB, "s1": dbs[1].DB}, NATS: nc,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Test: allocator.TestHooks{AckWait: 2 * time.Second, IdleCheck: 100 * time.Millisecond}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("allocator.Run: %v", err)
		}
	})
	var ids []string
	var acts []int64
	for a := int64(1000); len(acts) < 20; a++ {
		if bus.PartitionOf(a, 2) == 0 {
			acts = append(acts, a)
		}
	}
	publish := func(r wire.Request) {
		b, _ := json.Marshal(r)
		if _, err := js.Publish(ctx, wire.RequestSubject(r.ActivityID), b, jetstream.WithMsgID(r.RequestID)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.RequestID)
	}
	for _, a := range acts {
		c := int64(3)
		publish(wire.Request{RequestID: uuid.NewString(), Op: wire.OpOpen, ActivityID: a, Capacity: &c, ReceivedAt: time.Now().UTC()})
		for u := int64(1); u <= 5; u++ {
			publish(wire.Request{RequestID: uuid.NewString(), Op: wire.OpJoin, ActivityID: a, UserID: u, ReceivedAt: time.Now().UTC()})
		}
	}
	kv, err := js.KeyValue(ctx, shards.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	waitApplied := func(home int) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for dbs[home].Count(t, "SELECT COUNT(*) FROM processed_request") < int64(len(ids)) {
			if time.Now().After(deadline) {
				t.Fatalf("the requests are not applied on s%d", home)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitApplied(0)

	kills, refused, killed := 0, 0, map[int]bool{}
	for wait := 20 * time.Millisecond; ; wait = wait * 3 / 2 {
		cmd := exec.Command(bin, "shards", "move", "-partition", "0", "-to", "s1", "-settle", "500ms", "-lease", "1s")
		cmd.Env = env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var err error
		select {
		case err = <-exited:
		case <-time.After(wait):
			cmd.Process.Kill() //nolint:errcheck // it may have just exited
			err = <-exited
			kills++
		}
		var ee *exec.ExitError
		if err == nil {
			break
		}
		if errors.As(err, &ee) && ee.ExitCode() == 2 && strings.Contains(stderr.String(), "lease ends at") {
			// A killed run's lease: it names that process; wait.
			var pid int
			_, by, _ := strings.Cut(stderr.String(), "being run by ")
			if _, err := fmt.Sscanf(by, "allotctl pid %d on", &pid); err != nil || !killed[pid] {
				t.Errorf("refused by the lease of %q, want a killed run's (%v)", stderr.String(), killed)
			}
			refused++
			wait = wait * 2 / 3
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if !errors.As(err, &ee) || ee.ExitCode() != -1 {
			t.Fatalf("allotctl shards move (not killed) failed: %v\n%s", err, stderr.String())
		}
		killed[cmd.Process.Pid] = true
		pl, err := shards.Get(ctx, kv, 0)
		if err != nil {
			t.Fatal(err)
		}
		home := map[string]int{"s0": 0, "s1": 1}[pl.Shard]
		at, err := store.PartitionEpoch(ctx, dbs[home], 0)
		if err != nil || at != 0 && at != pl.Epoch {
			t.Fatalf("killed after %s: the map puts partition 0 on %s at epoch %d, its fence row there at epoch %d (%v)", wait, pl.Shard, pl.Epoch, at, err)
		}
		if wait > time.Minute {
			t.Fatal("the move never finished")
		}
	}
	t.Logf("the move finished after %d kills, %d runs refused by a killed run's lease", kills, refused)
	if refused == 0 {
		t.Error("no run was refused by the lease of a killed one: no kill landed after the record was taken")
	}
	if pl, err := shards.Get(ctx, kv, 0); err != nil || pl.Shard != "s1" || pl.Epoch != 2 {
		t.Fatalf("the map after the move: %+v, %v; want s1 at 2", pl, err)
	}
	waitApplied(1)
	for _, a := range acts {
		if n := dbs[0].Count(t, "SELECT COUNT(*) FROM activity WHERE id = ?", a) + dbs[0].Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ?", a); n != 0 {
			t.Errorf("activity %d has %d rows left on s0", a, n)
		}
		if n := dbs[1].Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ?", a); n != 5 {
			t.Errorf("activity %d has %d signups on s1, want 5", a, n)
		}
	}
	for _, id := range ids {
		if n := dbs[1].Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", id); n != 1 {
			t.Errorf("request %s has %d results on s1, want 1", id, n)
		}
	}
	if n := dbs[0].Count(t, "SELECT COUNT(*) FROM processed_request WHERE partition_id = 0"); n != 0 {
		t.Errorf("%d results of partition 0 left on s0", n)
	}
	for _, db := range dbs {
		db.CheckInvariants(t)
	}
}
