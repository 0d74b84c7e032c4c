package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestShards: setup seeds the map from ALLOT_MYSQL_SHARDS (partition mod
// shards); `allotctl shards` prints one line a partition with its shard,
// epoch 1, its revision, its fence read from the partition's own shard
// and its lag (its allocator consumer's pending and unacknowledged
// messages); a shard that does not answer shows `-` for its partitions and
// a line on stderr naming it.
func TestShards(t *testing.T) {
	ns := natstest.New(t)
	a, b := dbtest.New(t), dbtest.New(t)
	ctx := context.Background()
	for _, q := range []struct {
		db   *dbtest.DB
		stmt string
	}{
		{a, "INSERT INTO allocator_partition (partition_id, last_seq) VALUES (0, 17), (1, 99)"}, // 1 is b's: a's row is not read
		{b, "INSERT INTO allocator_partition (partition_id, last_seq) VALUES (1, 42)"},
	} {
		if _, err := q.db.ExecContext(ctx, q.stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("ALLOT_NATS_URL", ns.URL())
	t.Setenv("ALLOT_PARTITIONS", "4")
	t.Setenv("ALLOT_MYSQL_DSN", a.DSN)
	t.Setenv("ALLOT_MYSQL_SHARDS", "a="+a.DSN+",b="+b.DSN+",c=u:secret@tcp(127.0.0.1:1)/allot")
	if code, _, stderr := allotctl(t, "setup"); code != 0 || strings.Contains(stderr, "secret") || !strings.Contains(stderr, "c=u:*****@") {
		t.Fatalf("setup: exit %d, want 0 and ALLOT_MYSQL_SHARDS printed masked:\n%s", code, stderr)
	}
	// Partition 0's consumer with three messages it has not applied.
	_, js := ns.Connect(t)
	if _, err := bus.EnsureAllocatorConsumer(ctx, js, bus.ConsumerConfig{Partition: 0, Partitions: 4, MaxAckPending: 100, AckWait: time.Minute}); err != nil {
		t.Fatal(err)
	}
	activity := int64(1)
	for bus.PartitionOf(activity, 4) != 0 {
		activity++
	}
	for range 3 {
		if _, err := js.Publish(ctx, wire.RequestSubject(activity), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	code, stdout, stderr := allotctl(t, "shards")
	if code != 0 {
		t.Fatalf("shards: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{`0\s+a\s+1\s+\d+\s+17\s+3`, `1\s+b\s+1\s+\d+\s+42\s+-`, `2\s+c\s+1\s+\d+\s+-\s+-`, `3\s+a\s+1\s+\d+\s+0\s+-`} {
		if !regexp.MustCompile(`(?m)^` + want + `\s*$`).MatchString(stdout) {
			t.Errorf("shards: no line %q in\n%s", want, stdout)
		}
	}
	if n := strings.Count(strings.TrimSpace(stdout), "\n"); n != 4 {
		t.Errorf("shards: %d lines after the header, want 4:\n%s", n, stdout)
	}
	if !strings.Contains(stderr, "shard c does not answer") || strings.Contains(stderr, "secret") {
		t.Errorf("shards: stderr does not name the shard that does not answer (masked):\n%s", stderr)
	}
	// setup with another list of shards rewrites nothing.
	t.Setenv("ALLOT_MYSQL_SHARDS", "c="+a.DSN)
	if code, _, stderr := allotctl(t, "setup"); code != 0 {
		t.Fatalf("setup again: exit %d\n%s", code, stderr)
	}
	t.Setenv("ALLOT_MYSQL_SHARDS", "a="+a.DSN+",b="+b.DSN+",c=u:secret@tcp(127.0.0.1:1)/allot")
	if _, again, _ := allotctl(t, "shards"); again != stdout {
		t.Errorf("shards after a setup with other shards:\n%s\nwant\n%s", again, stdout)
	}
	// A bad list is refused in one line.
	t.Setenv("ALLOT_MYSQL_SHARDS", "a="+a.DSN+",a="+a.DSN)
	if code, _, stderr := allotctl(t, "shards"); code != 2 || !strings.Contains(stderr, `names shard "a" twice`) {
		t.Errorf("shards with a duplicate shard: exit %d, %q", code, stderr)
	}
}

// TestShardsLagUnderPermissions: as the allotctl user of
// deploy/nats/accounts.conf, on a server that runs that file, `allotctl
// shards` reads each partition's consumer info: the lag is shown, with no
// permissions violation.
func TestShardsLagUnderPermissions(t *testing.T) {
	dir := t.TempDir()
	accounts, err := os.ReadFile(filepath.Join("..", "..", "deploy", "nats", "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"INGEST", "ALLOCATOR", "NOTIFIER", "AUDIT", "ALLOTCTL", "ADMIN"} {
		t.Setenv("NATS_"+role+"_PASSWORD", strings.ToLower(role)+"-pw")
	}
	conf := fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\ninclude ./accounts.conf\n", filepath.Join(dir, "store"))
	if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), accounts, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	url := func(role string) string {
		return strings.Replace(ns.ClientURL(), "nats://", "nats://"+role+":"+role+"-pw@", 1)
	}
	db := dbtest.New(t)
	t.Setenv("ALLOT_MYSQL_DSN", db.DSN)
	t.Setenv("ALLOT_MYSQL_SHARDS", "")
	t.Setenv("ALLOT_PARTITIONS", "1")
	t.Setenv("ALLOT_NATS_URL", url("admin"))
	if code, _, stderr := allotctl(t, "setup"); code != 0 {
		t.Fatalf("setup as admin: exit %d\n%s", code, stderr)
	}
	nc, err := nats.Connect(url("admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := bus.EnsureAllocatorConsumer(ctx, js, bus.ConsumerConfig{Partition: 0, Partitions: 1, MaxAckPending: 100, AckWait: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := js.Publish(ctx, wire.RequestSubject(7), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("ALLOT_NATS_URL", url("allotctl"))
	code, stdout, stderr := allotctl(t, "shards")
	if code != 0 || !regexp.MustCompile(`(?m)^0\s+default\s+1\s+\d+\s+0\s+2\s*$`).MatchString(stdout) || strings.Contains(stderr, "not shown") {
		t.Errorf("shards as allotctl: exit %d, want 0 and partition 0's lag 2\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}
