package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/stacktest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// TestDeadShardThroughTheAPI: three shards, six partitions, the allocator
// and ingest running. One shard's server is killed -9 in the middle of a
// burst of joins sent through the API: every write still answers 202; the
// dead shard's activities answer 503 naming it (state, signup, poll);
// the other shards' activities keep being applied and read; both
// processes' /readyz stay 200. Once the server is back every request id
// reaches done, each applied once, in order, on its activity's shard, and
// the invariants hold on every shard.
func TestDeadShardThroughTheAPI(t *testing.T) {
	const (
		n          = 3
		partitions = 6
		dead       = 1
		users      = 8
		capacity   = 3
	)
	acfg := config.Defaults[allocator.Config]()
	// Short enough that the dead shard's partitions are given up while it
	// is down, which must not make the allocator unready.
	acfg.Partitions, acfg.StallTimeout = partitions, 2*time.Second
	st := stacktest.StartShards(t, n, acfg, stacktest.IngestConfig(), ingest.Deps{})
	s := &stack{t: t, url: st.URL, js: st.JS,
		cl: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}}
	home := func(a int64) int { return bus.PartitionOf(a, partitions) % n }

	acts := make([]int64, 18)
	for i := range acts {
		acts[i] = int64(5000 + i)
	}
	onDead, onLive := 0, 0
	for _, a := range acts {
		if home(a) == dead {
			onDead++
		} else {
			onLive++
		}
		s.open(int(a), capacity)
	}
	if onDead == 0 || onLive == 0 {
		t.Fatalf("%d activities on the dead shard, %d on the others: want some of each", onDead, onLive)
	}

	// The burst: each activity's joins in order, the activities at once;
	// the shard dies once a third of the writes are acknowledged.
	ids := make(map[int64][]string, len(acts))
	var (
		mu     sync.Mutex
		acked  atomic.Int64
		killed = make(chan struct{})
		wg     sync.WaitGroup
		errs   = make(chan error, len(acts)*users)
	)
	go func() {
		defer close(killed)
		for acked.Load() < int64(len(acts)*users/3) {
			time.Sleep(time.Millisecond)
		}
		if err := st.Procs[dead].Kill(); err != nil {
			errs <- err
		}
		t.Logf("s%d killed after %d of %d writes were acknowledged", dead, acked.Load(), len(acts)*users)
	}()
	for _, a := range acts {
		wg.Go(func() {
			for u := int64(1); u <= users; u++ {
				code, m, err := s.try("POST", fmt.Sprintf("/v1/activities/%d/signups/%d", a, u), "")
				if err == nil && code != http.StatusAccepted {
					err = fmt.Errorf("join %d/%d (shard s%d): %d %v, want 202", a, u, home(a), code, m)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				ids[a] = append(ids[a], m["request_id"].(string))
				mu.Unlock()
				acked.Add(1)
			}
		})
	}
	wg.Wait()
	<-killed
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Writes go on while it is down, and answer 202.
	for _, a := range acts {
		if home(a) != dead {
			continue
		}
		code, m := s.call("POST", fmt.Sprintf("/v1/activities/%d/signups/%d", a, users+1), "")
		if code != http.StatusAccepted {
			t.Fatalf("join %d/%d with s%d dead: %d %v, want 202", a, users+1, dead, code, m)
		}
		ids[a] = append(ids[a], m["request_id"].(string))
	}

	// The other shards' activities are applied and read as if nothing
	// happened; the dead shard's answer 503 naming it.
	for _, a := range acts {
		if home(a) == dead {
			for _, p := range []string{fmt.Sprintf("/v1/activities/%d", a), fmt.Sprintf("/v1/activities/%d/signups/1", a), "/v1/requests/" + ids[a][0]} {
				code, m := s.call("GET", p, "")
				msg, _ := m["error"].(string)
				if code != http.StatusServiceUnavailable || !strings.Contains(msg, fmt.Sprintf("shard s%d ", dead)) {
					t.Errorf("GET %s with s%d dead: %d %v, want 503 naming s%d", p, dead, code, m, dead)
				}
			}
			continue
		}
		for _, id := range ids[a] {
			if err := s.tryDone("GET", "/v1/requests/"+id+"?wait=20s", nil); err != nil {
				t.Fatalf("a request of a live shard while s%d is dead: %v", dead, err)
			}
		}
		code, m := s.call("GET", fmt.Sprintf("/v1/activities/%d", a), "")
		if code != http.StatusOK || m["confirmed"] != float64(capacity) || m["waiting"] != float64(users-capacity) {
			t.Errorf("activity %d on s%d with s%d dead: %d %v, want %d confirmed, %d waiting", a, home(a), dead, code, m, capacity, users-capacity)
		}
	}
	for name, url := range map[string]string{"ingest": st.URL, "allocator": st.AllocatorURL} {
		code, body := getBody(t, url+"/readyz")
		if code != http.StatusOK || !strings.Contains(body, fmt.Sprintf(`"s%d":"down"`, dead)) {
			t.Errorf("%s /readyz with s%d dead: %d %s, want 200 listing it down", name, dead, code, body)
		}
	}
	// Long enough for the dead shard's partitions to be given up.
	testenv.WaitFor(t, 30*time.Second, "the dead shard's partitions given up", func() bool {
		_, body := getBody(t, st.AllocatorURL+"/metrics")
		return strings.Contains(body, "allot_allocator_partition_stalled{partition=\"1\"} 1")
	})
	if code, body := getBody(t, st.AllocatorURL+"/readyz"); code != http.StatusOK {
		t.Errorf("allocator /readyz with the dead shard's partitions given up: %d %s, want 200", code, body)
	}

	if err := st.Procs[dead].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, a := range acts {
		for _, id := range ids[a] {
			testenv.WaitFor(t, 2*time.Minute, "request "+id+" done", func() bool {
				return s.tryDone("GET", "/v1/requests/"+id+"?wait=10s", nil) == nil
			})
		}
	}
	// Applied once each, in order, on the activity's shard only.
	for _, a := range acts {
		for i, db := range st.DBs {
			rows := db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ?", a)
			want := int64(0)
			if i == home(a) {
				want = int64(len(ids[a]) + 1) // the open too
			}
			if rows != want {
				t.Errorf("activity %d (on s%d): %d results on s%d, want %d", a, home(a), rows, i, want)
			}
		}
		db := st.DBs[home(a)]
		for _, id := range ids[a] {
			if c := db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", id); c != 1 {
				t.Errorf("request %s: %d results, want 1", id, c)
			}
		}
		var got, want strings.Builder
		rows, err := db.Query("SELECT user_id, status FROM activity_signup WHERE activity_id = ? ORDER BY queue_seq", a)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var (
				u      int64
				status string
			)
			if err := rows.Scan(&u, &status); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&got, "%d:%s ", u, status)
		}
		rows.Close()
		for u := 1; u <= len(ids[a]); u++ {
			status := wire.StatusWaiting
			if u <= capacity {
				status = wire.StatusConfirmed
			}
			fmt.Fprintf(&want, "%d:%s ", u, status)
		}
		if got.String() != want.String() {
			t.Errorf("activity %d signups in queue order: %q, want %q", a, got.String(), want.String())
		}
	}
	for _, db := range st.DBs {
		db.CheckInvariants(t)
	}
}

// getBody is GET url's status and body (0 and the error when none came).
func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}
