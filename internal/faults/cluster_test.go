package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// clusterTimeout bounds the cluster's own recoveries: a leader election
// after a node died, a restarted node catching up.
const clusterTimeout = 60 * time.Second

// startCluster runs n natsd processes as one JetStream cluster on loopback
// ports (node i is server n<i+1>, fsync always, own store) and waits until
// each accepts clients. It does not wait for the JetStream meta leader:
// ingest and the allocators start against a cluster that has just formed,
// as they do after a deploy, and must wait for it themselves.
func (s *stack) startCluster(n int) error {
	t := s.t
	routes := make([]string, n)
	routePorts := make([]int, n)
	for i := range n {
		routePorts[i] = freePort(t)
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[i])
	}
	for i := range n {
		port := freePort(t)
		s.nodeURLs = append(s.nodeURLs, fmt.Sprintf("nats://127.0.0.1:%d", port))
		s.nodes = append(s.nodes, newProc(t, fmt.Sprintf("natsd-n%d", i+1), "natsd", []string{
			"ALLOT_EMBEDDED_NATS_HOST=127.0.0.1",
			fmt.Sprintf("ALLOT_EMBEDDED_NATS_PORT=%d", port),
			"ALLOT_EMBEDDED_NATS_STORE=" + t.TempDir(),
			"ALLOT_EMBEDDED_NATS_SYNC=0s",
			"ALLOT_EMBEDDED_NATS_CLUSTER=allot-faults",
			fmt.Sprintf("ALLOT_EMBEDDED_NATS_NAME=n%d", i+1),
			fmt.Sprintf("ALLOT_EMBEDDED_NATS_CLUSTER_PORT=%d", routePorts[i]),
			"ALLOT_EMBEDDED_NATS_ROUTES=" + strings.Join(routes, ","),
		}))
	}
	s.natsd = s.nodes[0]
	s.natsAddr = strings.TrimPrefix(s.nodeURLs[0], "nats://")
	s.natsURL = strings.Join(s.nodeURLs, ",")
	for i := range n {
		if _, err := s.nodes[i].start(); err != nil {
			return err
		}
	}
	for i := range n {
		if err := s.waitNode(i, startTimeout); err != nil {
			return err
		}
	}
	return nil
}

// waitNode waits until node i's current incarnation prints its URL.
func (s *stack) waitNode(i int, within time.Duration) error {
	p := s.nodes[i]
	return poll(within, p.name+" ready", func() (bool, error) {
		if err := p.exited(); err != nil {
			return false, fmt.Errorf("%w: %w", errDied, err)
		}
		return strings.Contains(p.current().output.String(), s.nodeURLs[i]+"\n"), nil
	})
}

// natsProcs are the NATS processes of the stack: the one natsd, or every
// node of the cluster.
func (s *stack) natsProcs() []*proc {
	if len(s.nodes) > 0 {
		return s.nodes
	}
	return []*proc{s.natsd}
}

// streamInfo reads a stream's info with a short deadline: while a stream
// has no leader nobody answers.
func (s *stack) streamInfo(name string) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	info := st.CachedInfo()
	if info.Cluster == nil {
		return nil, errors.New(name + " has no cluster info")
	}
	return info, nil
}

// clusterWhole reports whether every stream and bucket allot keeps has a
// leader and two current replicas, and the JetStream API answers.
func (s *stack) clusterWhole() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := s.js.AccountInfo(ctx); err != nil {
		return false, err
	}
	for _, name := range []string{wire.RequestStream, wire.EventStream, bus.KeyValueStream(wire.ViewBucket), bus.KeyValueStream("ALLOT_IDEMPOTENCY")} {
		info, err := s.streamInfo(name)
		if err != nil {
			return false, fmt.Errorf("%s: %w", name, err)
		}
		if info.Cluster.Leader == "" || len(info.Cluster.Replicas) != len(s.nodes)-1 {
			return false, fmt.Errorf("%s: leader %q, %d replicas", name, info.Cluster.Leader, len(info.Cluster.Replicas))
		}
		for _, p := range info.Cluster.Replicas {
			if !p.Current || p.Offline {
				return false, fmt.Errorf("%s: replica %s not current", name, p.Name)
			}
		}
	}
	return true, nil
}

// nodeOf is the index of the node whose server name is name (n1, n2, …).
func (s *stack) nodeOf(name string) (int, error) {
	var i int
	if _, err := fmt.Sscanf(name, "n%d", &i); err != nil || i < 1 || i > len(s.nodes) {
		return 0, fmt.Errorf("no node is named %q", name)
	}
	return i - 1, nil
}

// replicasOf reads the replicas of every stream and bucket allot keeps.
func (s *stack) replicasOf() (map[string]int, error) {
	out := map[string]int{}
	for _, name := range []string{wire.RequestStream, wire.EventStream, bus.KeyValueStream(wire.ViewBucket), bus.KeyValueStream("ALLOT_IDEMPOTENCY")} {
		info, err := s.streamInfo(name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = info.Config.Replicas
	}
	return out, nil
}

// TestScenario10ClusterKillStreamLeader: three natsd processes form a
// JetStream cluster; ingest and two allocators (every node's URL) create
// the streams with three replicas, waiting for the fresh cluster rather
// than exiting. Mid-burst the request stream's leader is killed with
// SIGKILL; once another node leads the stream it is restarted and catches
// up. Every 202 is applied exactly once, in stream order, every event is
// published, and the audit is clean. Then an ingest started without
// ALLOT_STREAM_REPLICAS leaves every stream at three replicas.
func TestScenario10ClusterKillStreamLeader(t *testing.T) {
	tr := defaultTraffic(10)
	tr.requests = 6000 // ten seconds at 600/s: an election fits inside
	r3 := []string{"ALLOT_STREAM_REPLICAS=3"}
	// Checkpoints every second, taken by either allocator while both run.
	allocEnv := append(slices.Clone(r3), "ALLOT_CHECKPOINT_INTERVAL=1s")
	run(t, scenario{n: 10, name: "cluster-kill-stream-leader", traffic: tr,
		stack: stackConfig{cluster: 3, allocators: 2, allocEnv: allocEnv, ingestEnv: r3},
		fault: func(s *stack, b *burst, r *faultResult) error {
			if !b.reached(0.3) {
				return errors.New("the burst ended before the fault")
			}
			info, err := s.streamInfo(wire.RequestStream)
			if err != nil {
				return err
			}
			old := info.Cluster.Leader
			i, err := s.nodeOf(old)
			if err != nil {
				return err
			}
			killed := time.Now()
			if err := s.nodes[i].kill(); err != nil {
				return err
			}
			r.note("killed_leader=%s at=%d/%d", old, b.done.Load(), len(b.reqs))
			var now string
			err = poll(clusterTimeout, "another node leads "+wire.RequestStream, func() (bool, error) {
				info, err := s.streamInfo(wire.RequestStream)
				if err != nil {
					return false, err
				}
				now = info.Cluster.Leader
				return now != "" && now != old, nil
			})
			if err != nil {
				return err
			}
			r.count.Add(1) // the fault took effect: leadership moved
			r.note("new_leader=%s after=%s", now, time.Since(killed).Round(10*time.Millisecond))
			if err := s.startNodeAgain(i); err != nil {
				return err
			}
			err = poll(clusterTimeout, old+" current again", func() (bool, error) {
				info, err := s.streamInfo(wire.RequestStream)
				if err != nil {
					return false, err
				}
				for _, p := range info.Cluster.Replicas {
					if p.Name == old && p.Current && !p.Offline {
						r.note("rejoined_after=%s", time.Since(killed).Round(10*time.Millisecond))
						return true, nil
					}
				}
				return false, fmt.Errorf("%s is not a current replica yet", old)
			})
			if err != nil {
				return err
			}
			// Whole again: every stream and bucket led, every replica
			// current, the JetStream API answering.
			return poll(clusterTimeout, "every stream led with all replicas current", s.clusterWhole)
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			if r.count.Load() != 1 {
				t.Fatal("the request stream's leader was not killed, or leadership did not move")
			}
			requireBatches(t, s, m, r)
			if m.maybe > 0 {
				// 503s that named their request: the leader died between
				// storing and its PubAck. Checked exactly above: stored
				// ones applied once, none unaccounted for.
				m.notes = append(m.notes, fmt.Sprintf("maybe_stored_503=%d stored=%d", m.maybe, m.maybeStored))
			}
			for i, p := range append([]*proc{s.ingest}, s.allocs...) {
				if n := p.current().n; n != 1 {
					t.Errorf("%s (process %d) was restarted %d times: it must wait for the cluster, not exit", p.name, i, n-1)
				}
			}
			want := func(when string) {
				t.Helper()
				got, err := s.replicasOf()
				if err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				for name, n := range got {
					if n != 3 {
						t.Errorf("%s: %s has %d replicas, want 3", when, name, n)
					}
				}
			}
			want("after the burst")
			// The audit from the allocators' checkpoints agrees as well.
			rep, err := audit.Run(context.Background(), audit.Config{FromCheckpoint: true}, audit.Deps{DB: s.db.DB, JS: s.js})
			switch {
			case err != nil:
				t.Errorf("audit -from-checkpoint: %v", err)
			case !rep.OK || len(rep.Checkpoints) != 1 || !rep.Checkpoints[0].DigestOK:
				t.Errorf("audit -from-checkpoint: ok %v, checkpoints %+v, %d divergences", rep.OK, rep.Checkpoints, len(rep.Divergences))
			default:
				m.notes = append(m.notes, fmt.Sprintf("from_checkpoint_verified=%d..%d", rep.VerifiedFrom, rep.VerifiedTo))
			}
			// A binary started without ALLOT_STREAM_REPLICAS (default 1).
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			plain := newProc(t, "ingest-without-replicas", "ingest", []string{
				"ALLOT_NATS_URL=" + s.natsURL, "ALLOT_MYSQL_DSN=" + s.db.DSN, "ALLOT_HTTP_ADDR=" + addr,
				"ALLOT_MYSQL_MAX_CONNS=2",
			})
			if _, err := plain.start(); err != nil {
				t.Fatal(err)
			}
			if err := poll(startTimeout, "ingest without ALLOT_STREAM_REPLICAS ready", httpReady(plain, "http://"+addr+"/readyz")); err != nil {
				t.Fatal(err)
			}
			want("after an ingest without ALLOT_STREAM_REPLICAS started")
			if err := plain.stop(30 * time.Second); err != nil {
				t.Error(err)
			}
			if slices.ContainsFunc(m.notes, func(n string) bool { return strings.HasPrefix(n, "rejoined_after=") }) {
				return
			}
			t.Error("the killed node did not rejoin as a current replica")
		},
	})
}

// startNodeAgain starts node i again on its store and ports and waits
// until it accepts clients.
func (s *stack) startNodeAgain(i int) error {
	if _, err := s.nodes[i].start(); err != nil {
		return err
	}
	// A node killed mid-burst listens only once it has recovered its
	// store, which under the race detector on a busy machine takes a while.
	return s.waitNode(i, clusterTimeout)
}
