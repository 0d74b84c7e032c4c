package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// scenario is one fault-injection run.
type scenario struct {
	n       int
	name    string
	stack   stackConfig
	traffic trafficConfig
	// fault runs alongside the burst: it watches the burst's progress,
	// injects the fault and returns once the system is whole again (or the
	// fault cannot be injected).
	fault func(s *stack, b *burst, r *faultResult) error
	// check, when set, adds the scenario's own assertions after the
	// common ones.
	check func(t *testing.T, s *stack, m *summary, r *faultResult)
}

// faultResult is what a fault reports back.
type faultResult struct {
	notes []string
	// poison are the stream sequences of messages published straight to
	// the request stream, which the allocator must reject.
	poison []uint64
	// counters of the injected faults, scenario-specific.
	count atomic.Int64
}

func (r *faultResult) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// defaultTraffic: 3000 writes by 32 clients at 600/s — a five second burst
// of joins, cancels and claims by 300 users on three small activities.
func defaultTraffic(n int) trafficConfig {
	seed := uint64(n)
	if v, err := strconv.ParseUint(os.Getenv("ALLOT_FAULTS_SEED"), 10, 64); err == nil {
		seed += v
	}
	return trafficConfig{seed: seed, requests: 3000, users: 300, clients: 32, perSecond: 600, activities: defaultActivities}
}

func run(t *testing.T, sc scenario) summary {
	t.Helper()
	start := time.Now()
	if sc.traffic.requests == 0 {
		sc.traffic = defaultTraffic(sc.n)
	}
	sc.stack.clients = sc.traffic.clients
	s := newStack(t, sc.stack)
	s.openActivities(sc.traffic.activities)
	t.Logf("scenario %d: stack up in %s; burst of %d requests, %d clients, seed %d",
		sc.n, time.Since(start).Round(time.Millisecond), sc.traffic.requests, sc.traffic.clients, sc.traffic.seed)

	b := &burst{reqs: plan(sc.traffic)}
	var fr faultResult
	faultErr := make(chan error, 1)
	go func() { faultErr <- sc.fault(s, b, &fr) }()
	s.fire(b, sc.traffic)
	if err := <-faultErr; err != nil {
		t.Errorf("fault injection: %v", err)
	}
	t.Logf("scenario %d: burst answered in %s", sc.n, b.took.Round(time.Millisecond))
	for _, p := range append(append(s.natsProcs(), s.ingest), s.allocs...) {
		if err := p.exited(); err != nil && !s.killedForGood[p] {
			t.Errorf("a process died by itself: %v", err)
		}
	}

	m := s.verify(sc.n, sc.name, b.answers, len(fr.poison), start)
	m.notes = fr.notes
	if sc.check != nil {
		sc.check(t, s, &m, &fr)
	}
	s.report(m)
	s.shutdown()
	return m
}

// TestScenario1KillAllocator: kill -9 the allocator mid-burst, restart it;
// every accepted request is applied exactly once.
func TestScenario1KillAllocator(t *testing.T) {
	run(t, scenario{n: 1, name: "kill-allocator",
		fault: func(s *stack, b *burst, r *faultResult) error {
			if !b.reached(1.0 / 3) {
				return errors.New("the burst ended before the fault")
			}
			r.note("killed_at=%d/%d", b.done.Load(), len(b.reqs))
			if err := s.allocs[0].kill(); err != nil {
				return err
			}
			// Down for a moment while ingest keeps accepting.
			time.Sleep(500 * time.Millisecond)
			return s.startAllocator(0)
		},
		check: requireBatches,
	})
}

// requireBatches fails a scenario whose burst ran without request
// batches: what it proves must hold with them.
func requireBatches(t *testing.T, _ *stack, m *summary, _ *faultResult) {
	if m.batched == 0 {
		t.Error("no request shared its message with another: the burst ran without batches")
	}
}

// TestScenario2TwoAllocatorsKillOne: two allocator processes on the same
// partition; kill -9 the one that is applying (the pinned one once
// consumers are pinned; without pinning both pull from the one durable
// consumer) mid-burst and leave it dead. The survivor takes over, fills the
// dead one's gap from the stream, and the MySQL fence keeps every request
// applied exactly once.
func TestScenario2TwoAllocatorsKillOne(t *testing.T) {
	run(t, scenario{n: 2, name: "two-allocators-kill-one", stack: stackConfig{allocators: 2},
		fault: func(s *stack, b *burst, r *faultResult) error {
			if !b.reached(1.0 / 3) {
				return errors.New("the burst ended before the fault")
			}
			i, counts, err := s.busiestAllocator()
			if err != nil {
				return err
			}
			r.note("killed=%s decisions_before=%v", s.allocs[i].name, counts)
			s.killedForGood[s.allocs[i]] = true
			return s.allocs[i].kill()
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			for _, a := range s.allocs {
				if !s.killedForGood[a] && !a.alive() {
					t.Errorf("the surviving %s is not running", a.name)
				}
			}
		},
	})
}

// twoAllocators is the stack of scenario 3: a short pin timeout, so that
// the partition moves on quickly from a frozen allocator once consumers are
// pinned (binaries without pinning ignore the variable). Scenario 2 keeps
// the default, so its burst shows the real failover time.
var twoAllocators = stackConfig{allocators: 2, allocEnv: []string{"ALLOT_PINNED_TTL=1s"}}

// TestScenario3StaleAllocator: two allocators, and the one applying is
// frozen (SIGSTOP, possibly mid-transaction or holding a delivered batch)
// while the partition is unpinned from it (UnpinConsumer when the consumer
// has a priority group; without pinning both hold messages all along).
// The other takes over and fills the gap from the stream; the frozen one is
// thawed (SIGCONT) and comes back stale, its in-hand messages already
// applied. The fence must skip them: nothing applied twice, nothing lost.
// Done twice in the burst.
func TestScenario3StaleAllocator(t *testing.T) {
	run(t, scenario{n: 3, name: "stale-allocator", stack: twoAllocators,
		fault: func(s *stack, b *burst, r *faultResult) error {
			ctx := context.Background()
			for _, at := range []float64{0.25, 0.6} {
				if !b.reached(at) {
					return errors.New("the burst ended before the fault")
				}
				i, counts, err := s.busiestAllocator()
				if err != nil {
					return err
				}
				a := s.allocs[i]
				if err := a.signal(syscall.SIGSTOP); err != nil {
					return err
				}
				took, how, err := s.takeOver(ctx, i)
				if err := a.signal(syscall.SIGCONT); err != nil {
					return err
				}
				if err != nil {
					return err
				}
				r.count.Add(1)
				r.note("frozen=%s decisions_before=%v taken_over_in=%s by=%s", a.name, counts, took.Round(10*time.Millisecond), how)
			}
			return nil
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			if n := r.count.Load(); n != 2 {
				t.Errorf("%d takeovers observed, want 2", n)
			}
			for _, a := range s.allocs {
				if !a.alive() {
					t.Errorf("%s is not running", a.name)
				}
			}
		},
	})
}

// TestScenario4RestartNATS: the NATS server process dies (kill -9) mid-burst
// and comes back on the same store directory; later it is restarted
// gracefully (SIGTERM). Ingest answers 503 while it is down, reconnects by
// itself, and loses nothing it accepted.
func TestScenario4RestartNATS(t *testing.T) {
	run(t, scenario{n: 4, name: "restart-nats",
		fault: func(s *stack, b *burst, r *faultResult) error {
			if !b.reached(0.25) {
				return errors.New("the burst ended before the fault")
			}
			down := time.Now()
			if err := s.natsd.kill(); err != nil {
				return err
			}
			time.Sleep(time.Second)
			if err := s.startNATS(); err != nil {
				return err
			}
			r.note("nats_down_kill=%s", time.Since(down).Round(10*time.Millisecond))
			if !b.reached(0.6) {
				return errors.New("the burst ended before the second fault")
			}
			down = time.Now()
			if err := s.natsd.stop(30 * time.Second); err != nil {
				return err
			}
			time.Sleep(500 * time.Millisecond)
			if err := s.startNATS(); err != nil {
				return err
			}
			r.note("nats_down_term=%s", time.Since(down).Round(10*time.Millisecond))
			return nil
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			if m.r503 == 0 {
				t.Error("no 503 while NATS was down: the fault missed the burst")
			}
			// Recovered by itself: ready again without a restart.
			if err := poll(30*time.Second, "ingest ready after the NATS restarts",
				httpReady(s.ingest, s.ingestURL+"/readyz")); err != nil {
				t.Error(err)
			}
			if s.ingest.current().n != 1 {
				t.Error("ingest was restarted")
			}
		},
	})
}

// TestScenario5KillMySQLConnections: every MySQL connection to the
// scenario's database (the allocator's and ingest's) is killed with KILL
// CONNECTION, every 100ms through the middle half of the burst; the
// allocator retries and carries on. MariaDB itself is not restarted: the
// server is shared by everyone's tests on this machine.
func TestScenario5KillMySQLConnections(t *testing.T) {
	run(t, scenario{n: 5, name: "kill-mysql-connections",
		fault: func(s *stack, b *burst, r *faultResult) error {
			ctx := context.Background()
			cfg, err := mysql.ParseDSN(s.db.DSN)
			if err != nil {
				return err
			}
			dbName := cfg.DBName
			cfg.DBName = "" // the killer's own connection is on no database
			killer, err := store.Open(ctx, cfg.FormatDSN(), 1)
			if err != nil {
				return err
			}
			defer killer.Close()
			if !b.reached(0.25) {
				return errors.New("the burst ended before the fault")
			}
			rounds := 0
			for b.done.Load() < int64(0.75*float64(len(b.reqs))) {
				rounds++
				ids, err := connectionIDs(ctx, killer, dbName)
				if err != nil {
					return err
				}
				for _, id := range ids {
					// The connection may be gone already (1094: unknown thread).
					if _, err := killer.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatInt(id, 10)); err == nil {
						r.count.Add(1)
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			r.note("kill_rounds=%d connections_killed=%d", rounds, r.count.Load())
			return nil
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			if r.count.Load() == 0 {
				t.Error("no connection was killed: the fault missed")
			}
			if s.allocs[0].current().n != 1 || !s.allocs[0].alive() {
				t.Error("the allocator did not survive the killed connections by itself")
			}
		},
	})
}

// connectionIDs lists the connections on database db other than the
// caller's own.
func connectionIDs(ctx context.Context, q store.DBTX, db string) ([]int64, error) {
	rows, err := q.QueryContext(ctx, "SELECT id FROM information_schema.processlist WHERE db = ? AND user = 'root' AND id <> CONNECTION_ID()", db)
	if err != nil {
		return nil, fmt.Errorf("processlist: %w", err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// TestScenario6PoisonMessages: malformed messages published straight to the
// request stream mid-burst (garbage bytes, unknown op, wrong field types,
// a subject that does not match the activity, …) are terminated and
// recorded in rejected_message, and the partition keeps flowing.
func TestScenario6PoisonMessages(t *testing.T) {
	run(t, scenario{n: 6, name: "poison-messages",
		fault: func(s *stack, b *burst, r *faultResult) error {
			for _, at := range []float64{1.0 / 3, 2.0 / 3} {
				if !b.reached(at) {
					return errors.New("the burst ended before the fault")
				}
				for _, p := range poison() {
					ack, err := s.js.Publish(context.Background(), p.subject, p.data)
					if err != nil {
						return fmt.Errorf("publish poison %q: %w", p.what, err)
					}
					r.poison = append(r.poison, ack.Sequence)
				}
			}
			r.note("poison=%d", len(r.poison))
			return nil
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			ctx := context.Background()
			for _, seq := range r.poison {
				if n := s.db.Count(t, "SELECT COUNT(*) FROM rejected_message WHERE seq = ?", seq); n != 1 {
					t.Errorf("poison at seq %d: %d rejected_message rows, want 1", seq, n)
				}
				if n := s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE seq = ?", seq); n != 0 {
					t.Errorf("poison at seq %d has a result", seq)
				}
			}
			last := r.poison[len(r.poison)-1]
			if n := s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE seq > ?", last); n == 0 {
				t.Errorf("no request after the last poison (seq %d) was applied: the partition stalled", last)
			}
			// Terminated, not left for redelivery: nothing pending on the
			// allocator's consumer.
			err := poll(15*time.Second, "consumer without pending messages", func() (bool, error) {
				c, err := s.js.Consumer(ctx, wire.RequestStream, bus.AllocatorConsumer(0))
				if err != nil {
					return false, err
				}
				info, err := c.Info(ctx)
				if err != nil {
					return false, err
				}
				if info.NumAckPending != 0 || info.NumPending != 0 || info.NumRedelivered != 0 {
					return false, fmt.Errorf("ack pending %d, pending %d, redelivered %d",
						info.NumAckPending, info.NumPending, info.NumRedelivered)
				}
				return true, nil
			})
			if err != nil {
				t.Error(err)
			}
		},
	})
}

// poisonMsg is one malformed request message.
type poisonMsg struct {
	what, subject string
	data          []byte
}

// poison is one set of malformed messages for activity 101.
func poison() []poisonMsg {
	id := func() string { return uuid.Must(uuid.NewV7()).String() }
	at := time.Now().UTC().Format(time.RFC3339Nano)
	subj := wire.RequestSubject(101)
	return []poisonMsg{
		{"garbage bytes", subj, []byte{0xff, 0x00, 0xfe, 'x', '{'}},
		{"empty payload", subj, nil},
		{"unknown op", subj, fmt.Appendf(nil, `{"request_id":%q,"op":"steal","activity_id":101,"user_id":7,"received_at":%q}`, id(), at)},
		{"activity_id as a string", subj, fmt.Appendf(nil, `{"request_id":%q,"op":"join","activity_id":"101","user_id":7,"received_at":%q}`, id(), at)},
		{"user_id as an object", subj, fmt.Appendf(nil, `{"request_id":%q,"op":"claim","activity_id":101,"user_id":{"id":7},"received_at":%q}`, id(), at)},
		{"subject/activity mismatch", subj, fmt.Appendf(nil, `{"request_id":%q,"op":"join","activity_id":102,"user_id":7,"received_at":%q}`, id(), at)},
		{"request_id not a uuid", subj, fmt.Appendf(nil, `{"request_id":"nope","op":"join","activity_id":101,"user_id":7,"received_at":%q}`, at)},
		{"negative user", subj, fmt.Appendf(nil, `{"request_id":%q,"op":"cancel","activity_id":101,"user_id":-7,"received_at":%q}`, id(), at)},
		{"open with a user and no capacity", subj, fmt.Appendf(nil, `{"request_id":%q,"op":"open","activity_id":101,"user_id":7,"received_at":%q}`, id(), at)},
		{"trailing data", subj, fmt.Appendf(nil, `{"request_id":%q,"op":"join","activity_id":101,"user_id":7,"received_at":%q} {}`, id(), at)},
	}
}

// TestScenario7Overload: ~200 concurrent clients against an ingest bounded
// to 8 publishes in flight and 200 accepted writes/s: only 200, 202, 429
// and 503 come back, ingest does not crash, its memory stays bounded, and
// what it accepted is applied exactly once.
func TestScenario7Overload(t *testing.T) {
	// Ingest peaks near 25 MiB here; the race detector multiplies that
	// about tenfold (260 MiB), so its bound is scaled alike.
	rssBoundKiB := int64(100 << 10)
	if buildRace() {
		rssBoundKiB *= 8
	}
	var rssBefore int64
	tc := defaultTraffic(7)
	tc.requests, tc.clients, tc.perSecond = 20000, 200, 0
	run(t, scenario{n: 7, name: "overload", traffic: tc,
		stack: stackConfig{ingestEnv: []string{"ALLOT_INGEST_MAX_IN_FLIGHT=8", "ALLOT_INGEST_RATE_LIMIT=200"}},
		fault: func(s *stack, b *burst, r *faultResult) error {
			var err error
			if rssBefore, err = s.ingest.rssKiB(); err != nil {
				return err
			}
			// The overload is the traffic itself. The rate limit runs
			// before the in-flight bound, so at 200 writes/s the 8 slots
			// rarely fill while the broker answers in a millisecond: NATS
			// is frozen (SIGSTOP) for a second so that PubAcks stall and
			// the bound surely bites, again until a 503 is seen.
			if !b.reached(0.3) {
				return errors.New("the burst ended before the fault")
			}
			for try := 1; ; try++ {
				before, err := s.ingest503s()
				if err != nil {
					return err
				}
				if err := s.natsd.signal(syscall.SIGSTOP); err != nil {
					return err
				}
				time.Sleep(time.Second)
				if err := s.natsd.signal(syscall.SIGCONT); err != nil {
					return err
				}
				after, err := s.ingest503s()
				if err != nil {
					return err
				}
				if after > before {
					r.note("nats_frozen=%dx1s in_flight_503s_while_frozen=%.0f", try, after-before)
					break
				}
				if try == 3 || b.done.Load() >= int64(len(b.reqs)) {
					return fmt.Errorf("no 503 while NATS was frozen %d times: the in-flight bound never bit", try)
				}
			}
			// Sample memory meanwhile.
			var peak int64
			for !b.reached(1) {
				if v, err := s.ingest.rssKiB(); err == nil {
					peak = max(peak, v)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if v, err := s.ingest.rssKiB(); err == nil {
				peak = max(peak, v)
			}
			r.count.Store(peak)
			return nil
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			after, err := s.ingest.rssKiB()
			if err != nil {
				t.Fatalf("ingest memory: %v (is it still running?)", err)
			}
			peak := max(r.count.Load(), after)
			m.notes = append(m.notes, fmt.Sprintf("rss_before=%dMiB rss_peak=%dMiB rss_after=%dMiB", rssBefore>>10, peak>>10, after>>10))
			if peak > rssBoundKiB {
				t.Errorf("ingest RSS peaked at %d MiB, want below %d MiB", peak>>10, rssBoundKiB>>10)
			}
			if m.r429 == 0 {
				t.Error("no 429: the rate limit never bit")
			}
			if m.r503full == 0 {
				t.Error("no 503 with Retry-After: the in-flight bound never bit")
			}
			m.notes = append(m.notes, fmt.Sprintf("in_flight_503s=%d", m.r503full))
			if m.accepted == 0 {
				t.Error("nothing accepted under overload")
			}
			if err := poll(10*time.Second, "ingest /healthz after the overload", httpReady(s.ingest, s.ingestURL+"/healthz")); err != nil {
				t.Error(err)
			}
		},
	})
}

// TestScenario8CrashBeforeRelay: kill -9 the allocator again and again
// mid-burst (its relay publishes events after the commit, so some kills
// land between a commit and its events' publish), restarting it each time.
// After recovery every event of every committed change is on ALLOT_EVENTS
// once after dedupe by event_id.
func TestScenario8CrashBeforeRelay(t *testing.T) {
	run(t, scenario{n: 8, name: "crash-between-commit-and-relay",
		fault: func(s *stack, b *burst, r *faultResult) error {
			ctx := context.Background()
			var backlog []string
			landed := func() int {
				return len(slices.DeleteFunc(slices.Clone(backlog), func(n string) bool { return n == "0" }))
			}
			// Five kills, and up to three more while none has landed
			// between a commit and its relay.
			for k, at := range []float64{0.15, 0.3, 0.45, 0.6, 0.75, 0.82, 0.89, 0.96} {
				if k >= 5 && landed() > 0 {
					break
				}
				if !b.reached(at) {
					if k >= 5 {
						break
					}
					return errors.New("the burst ended before the fault")
				}
				if err := s.allocs[0].kill(); err != nil {
					return err
				}
				// What the dead relay left behind: committed results whose
				// events are not (known to be) published.
				n, err := store.OutboxBacklog(ctx, s.db.DB, 0)
				if err != nil {
					return err
				}
				backlog = append(backlog, strconv.FormatInt(n, 10))
				if err := s.startAllocator(0); err != nil {
					return err
				}
			}
			r.note("outbox_backlog_at_kills=[%s]", strings.Join(backlog, ","))
			r.count.Store(int64(landed()))
			if landed() == 0 {
				return fmt.Errorf("no kill landed between a commit and its events' relay (outbox backlog at each kill: [%s])",
					strings.Join(backlog, ","))
			}
			return nil
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			if r.count.Load() == 0 {
				t.Error("no kill landed between a commit and its events' relay: the scenario did not test what it names")
			}
		},
	})
}

// TestScenario9RestartMariaDB: kill -9 the database server mid-burst and
// start it again on the same data directory (crash recovery). Ingest keeps
// accepting (it needs only JetStream to do so), the allocator retries until
// the server is back and carries on; nothing committed is lost, nothing is
// applied twice.
func TestScenario9RestartMariaDB(t *testing.T) {
	run(t, scenario{n: 9, name: "restart-mariadb", stack: stackConfig{privateMySQL: true},
		fault: func(s *stack, b *burst, r *faultResult) error {
			if !b.reached(0.3) {
				return errors.New("the burst ended before the fault")
			}
			if err := s.mysqld.kill(); err != nil {
				return err
			}
			down := time.Now()
			time.Sleep(time.Second)
			cfg, err := mysql.ParseDSN(s.db.DSN)
			if err != nil {
				return err
			}
			cfg.DBName = ""
			if err := startAndWait(s.mysqld, cfg.FormatDSN()); err != nil {
				return err
			}
			r.count.Add(1)
			r.note("mariadb_down=%s", time.Since(down).Round(10*time.Millisecond))
			return nil
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			if r.count.Load() != 1 {
				t.Error("the database server was not restarted: the fault missed")
			}
			if s.allocs[0].current().n != 1 || !s.allocs[0].alive() {
				t.Error("the allocator did not survive the database restart by itself")
			}
		},
	})
}
