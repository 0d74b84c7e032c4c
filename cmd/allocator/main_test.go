package main

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/migrations"
)

// TestMigrateOnly: -migrate-only applies every migration to an empty
// database and exits 0 without NATS; run again, it changes nothing.
func TestMigrateOnly(t *testing.T) {
	db := dbtest.NewEmpty(t)
	t.Setenv("ALLOT_MYSQL_DSN", db.DSN)
	t.Setenv("ALLOT_NATS_URL", "") // not needed: it never connects
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("embedded migrations: %v %v", files, err)
	}
	for round := 1; round <= 2; round++ {
		var out bytes.Buffer
		if code := run(context.Background(), []string{"-migrate-only"}, &out); code != 0 {
			t.Fatalf("round %d: exit %d, want 0; output:\n%s", round, code, out.String())
		}
		if !strings.Contains(out.String(), "schema migrated") {
			t.Errorf("round %d: output does not say the schema was migrated:\n%s", round, out.String())
		}
		if n := db.Count(t, "SELECT COUNT(*) FROM schema_migration"); n != int64(len(files)) {
			t.Fatalf("round %d: %d migrations recorded, want %d", round, n, len(files))
		}
	}
	for _, table := range []string{"activity", "activity_signup", "processed_request", "rejected_message", "event_relay", "allocator_partition"} {
		if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", table); n != 1 {
			t.Errorf("table %s missing after -migrate-only", table)
		}
	}
}

// TestUsageErrors: bad flags, stray arguments and a missing NATS URL (when
// consuming) exit 2 with one line that says what to do.
func TestUsageErrors(t *testing.T) {
	db := dbtest.NewEmpty(t)
	t.Setenv("ALLOT_MYSQL_DSN", db.DSN)
	t.Setenv("ALLOT_NATS_URL", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-no-such-flag"}, "flag provided but not defined"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{nil, "ALLOT_NATS_URL is empty"},
	} {
		var out bytes.Buffer
		if code := run(context.Background(), tc.args, &out); code != 2 {
			t.Errorf("%q: exit %d, want 2; output:\n%s", tc.args, code, out.String())
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("%q: output lacks %q:\n%s", tc.args, tc.want, out.String())
		}
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"); n != 0 {
		t.Errorf("a refused start created %d tables", n)
	}
}

// TestStartsWithAShardDown: of two shards, s1 is killed before start.
// -migrate-only migrates s0 and exits 2 naming s1. The allocator starts
// anyway: /readyz 200 naming s1 down, allot_allocator_shard_up 0 for it;
// restarted, s1 is migrated and the gauge reads 1; the allocator exits 0
// when its context ends.
func TestStartsWithAShardDown(t *testing.T) {
	procs := dbtest.ServerProcs(t, 2)
	db0, db1 := dbtest.NewEmptyOn(t, procs[0].DSN), dbtest.NewEmptyOn(t, procs[1].DSN)
	if err := procs[1].Kill(); err != nil {
		t.Fatal(err)
	}
	ns := natstest.New(t)
	ns.Setup(t, natstest.Config(2), "s0", "s1")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv("ALLOT_MYSQL_SHARDS", "s0="+db0.DSN+",s1="+db1.DSN)
	t.Setenv("ALLOT_NATS_URL", ns.URL())
	t.Setenv("ALLOT_METRICS_ADDR", addr)
	t.Setenv("ALLOT_PARTITIONS", "2")
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if code := run(context.Background(), []string{"-migrate-only"}, &out); code != 2 {
		t.Fatalf("-migrate-only with s1 down: exit %d, want 2; output:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "allocator: shard s1 does not answer, not migrated") || strings.Contains(out.String(), "shard s0") {
		t.Errorf("-migrate-only with s1 down does not name s1 alone:\n%s", out.String())
	}
	if n := db0.Count(t, "SELECT COUNT(*) FROM schema_migration"); n != int64(len(files)) {
		t.Errorf("-migrate-only with s1 down: s0 has %d migrations, want %d", n, len(files))
	}

	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code := make(chan int, 1)
	go func() { code <- run(ctx, nil, logs) }()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	running := func() {
		select {
		case c := <-code:
			t.Fatalf("the allocator exited with %d; output:\n%s", c, logs)
		default:
		}
	}
	testenv.WaitFor(t, 30*time.Second, "/readyz 200 naming s1 down", func() bool {
		running()
		c, body := get("/readyz")
		return c == http.StatusOK && strings.Contains(body, `"s1":"down"`)
	})
	if _, metrics := get("/metrics"); !strings.Contains(metrics, `allot_allocator_shard_up{shard="s1"} 0`+"\n") ||
		!strings.Contains(metrics, `allot_allocator_shard_up{shard="s0"} 1`+"\n") {
		t.Errorf("/metrics while s1 is down lacks shard_up s0 1, s1 0")
	}
	if err := procs[1].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "s1 migrated, allot_allocator_shard_up 1", func() bool {
		running()
		_, metrics := get("/metrics")
		var n int64
		db1.QueryRow("SELECT COUNT(*) FROM schema_migration").Scan(&n) //nolint:errcheck // 0 until it is there
		return n == int64(len(files)) && strings.Contains(metrics, `allot_allocator_shard_up{shard="s1"} 1`+"\n")
	})
	cancel()
	if c := <-code; c != 0 {
		t.Errorf("the allocator exited with %d after its context ended, want 0; output:\n%s", c, logs)
	}
}

// syncBuffer is a buffer safe for concurrent writes and reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
