package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/testenv"
)

// TestStartsWithAShardDown: with two shards, one of which does not answer
// at start, ingest starts anyway and is ready (/readyz 200 listing it
// down); reads of that shard's activities answer 503 naming it, the
// other shard's answer.
func TestStartsWithAShardDown(t *testing.T) {
	db := dbtest.New(t)
	ns := natstest.New(t)
	ns.Setup(t, natstest.Config(2), "s0", "s1")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv("ALLOT_NATS_URL", ns.URL())
	t.Setenv("ALLOT_HTTP_ADDR", addr)
	t.Setenv("ALLOT_PARTITIONS", "2")
	t.Setenv("ALLOT_MYSQL_SHARDS", "s0="+db.DSN+",s1=root@tcp(127.0.0.1:1)/allot?timeout=1s") // nothing listens on port 1
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() { code <- run(ctx) }()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testenv.WaitFor(t, 30*time.Second, "ingest ready with s1 down", func() bool {
		select {
		case c := <-code:
			t.Fatalf("ingest exited with %d", c)
		default:
		}
		c, body := get("/readyz")
		return c == http.StatusOK && strings.Contains(body, `"s1":"down"`)
	})
	on := func(shard int) int64 {
		for a := int64(1); ; a++ {
			if bus.PartitionOf(a, 2) == shard {
				return a
			}
		}
	}
	if c, body := get(fmt.Sprintf("/v1/activities/%d", on(1))); c != http.StatusServiceUnavailable || !strings.Contains(body, "shard s1 ") {
		t.Errorf("read of an activity on s1: %d %s, want 503 naming s1", c, body)
	}
	if c, body := get(fmt.Sprintf("/v1/activities/%d", on(0))); c != http.StatusNotFound {
		t.Errorf("read of an activity never opened on s0: %d %s, want 404", c, body)
	}
	cancel()
	if c := <-code; c != 0 {
		t.Errorf("ingest exited with %d after its context ended, want 0", c)
	}
}
