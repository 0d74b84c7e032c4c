package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/notifier"
	"github.com/allot-dev/allot/internal/wire"
)

// natsRoles are the users of deploy/nats/accounts.conf; each gets a
// password of its own per scenario.
var natsRoles = []string{"ingest", "allocator", "notifier", "audit", "allotctl", "admin"}

func rolePassword(role string) string { return "faults-" + role + "-pw" }

// roleURL is the NATS URL of role on the permissions server.
func (s *stack) roleURL(role string) string {
	return "nats://" + role + ":" + rolePassword(role) + "@" + s.natsAddr
}

// startNATSWithPermissions runs the real nats-server (built from the module
// the embedded server comes from) on a configuration that includes
// deploy/nats/accounts.conf unchanged, the passwords in its environment as
// a deployment would set them. The test's own connection is admin.
func (s *stack) startNATSWithPermissions() error {
	t := s.t
	dir := t.TempDir()
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	accounts, err := os.ReadFile(filepath.Join(root, "deploy", "nats", "accounts.conf"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), accounts, 0o600); err != nil {
		return err
	}
	port := freePort(t)
	s.natsAddr = fmt.Sprintf("127.0.0.1:%d", port)
	conf := fmt.Sprintf("listen: %q\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\ninclude ./accounts.conf\n",
		s.natsAddr, filepath.Join(dir, "store"))
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(conf), 0o600); err != nil {
		return err
	}
	var env []string
	for _, r := range natsRoles {
		env = append(env, "NATS_"+strings.ToUpper(r)+"_PASSWORD="+rolePassword(r))
	}
	s.natsd = newProc(t, "nats-server", "nats-server", env, "-c", filepath.Join(dir, "nats.conf"))
	s.natsURL = s.roleURL("admin")
	if _, err := s.natsd.start(); err != nil {
		return err
	}
	return poll(startTimeout, "nats-server ready", func() (bool, error) {
		if err := s.natsd.exited(); err != nil {
			return false, fmt.Errorf("%w: %w", errDied, err)
		}
		c, err := net.DialTimeout("tcp", s.natsAddr, time.Second)
		if err != nil {
			return false, nil
		}
		c.Close()
		return true, nil
	})
}

// moduleRoot is the directory of go.mod, found from the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// violations collects the permissions violations a connection is told of.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrPermissionViolation) {
		v.mu.Lock()
		v.errs = append(v.errs, err.Error())
		v.mu.Unlock()
	}
}

func (v *violations) about(subject string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, e := range v.errs {
		if strings.Contains(e, `"`+subject+`"`) {
			return true
		}
	}
	return false
}

// TestScenario11NATSPermissions: the real nats-server runs
// deploy/nats/accounts.conf; `allotctl setup` runs as admin, the allocator
// and ingest connect as their own users and the whole burst flows (every
// accepted request applied once, events relayed, the audit clean, run as
// the audit user), and so do a claim shed from the view, a hold
// that lapses (its expiry scheduled through ALLOT_HOLDS) and promotes the
// waiter, and the notifier's deliveries; no binary logs a violation. Meanwhile, as
// the ingest user, the test tries to forge a result on allot.results, put
// a view, register a fake allocator and delete the request stream: each
// is refused by the server, and none of them changed anything.
func TestScenario11NATSPermissions(t *testing.T) {
	// Every queue of requests is published as one atomic batch, so the
	// ingest user's batches (Nats-Batch-* headers) are proven too.
	run(t, scenario{n: 11, name: "nats-permissions", stack: stackConfig{natsPermissions: true,
		ingestEnv: []string{"ALLOT_INGEST_COMMIT_MIN_BATCH=1"}},
		fault: func(s *stack, b *burst, r *faultResult) error {
			if !b.reached(1.0 / 3) {
				return errors.New("the burst ended before the attempts")
			}
			return s.tryAsIngest(r)
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			if got := r.count.Load(); got != 4 {
				t.Errorf("%d of 4 forbidden operations were refused", got)
			}
			s.flowUnderPermissions(t, m)
			nc, err := bus.Connect(s.roleURL("audit"), "audit", slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatalf("connect as audit: %v", err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := audit.Run(context.Background(), audit.Config{}, audit.Deps{DB: s.db.DB, JS: js})
			if err != nil {
				t.Fatalf("the audit as the audit user: %v", err)
			}
			if n := len(rep.Divergences); n != 0 {
				t.Errorf("the audit as the audit user found %d divergences", n)
			}
			m.notes = append(m.notes, fmt.Sprintf("audit_as_audit_user=ok(%d replayed)", rep.Replayed))
			m.notes = append(m.notes, fmt.Sprintf("notifier_dead_letters=%d", s.notifyAsNotifier(t)))
			batches := s.ingestMetric(t, "allot_ingest_commit_batch_size_count")
			if batches == "" || batches == "0" {
				t.Errorf("ingest published no atomic batch (allot_ingest_commit_batch_size_count %q): the batch path went unproven", batches)
			}
			m.notes = append(m.notes, "ingest_batches="+batches)
			// The binaries, each as its own user, never met a subject
			// they may not use.
			for _, p := range append([]*proc{s.ingest}, s.allocs...) {
				if out := p.current().output.String(); strings.Contains(out, "permissions violation") {
					t.Errorf("%s logged a NATS permissions violation under accounts.conf", p.name)
				}
			}
		},
	})
}

// tryAsIngest attempts, as the ingest user, what only allocators (or
// admins) may do, and counts in r each attempt the server refused without
// effect.
func (s *stack) tryAsIngest(r *faultResult) error {
	var v violations
	nc, err := bus.Connect(s.roleURL("ingest"), "faults-forger", slog.New(slog.NewTextHandler(io.Discard, nil)),
		nats.ErrorHandler(v.handler), nats.CustomInboxPrefix(bus.InboxPrefix("ingest")))
	if err != nil {
		return fmt.Errorf("connect as ingest: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	refused := func(what, subject string, attempt func(context.Context) error, unchanged func() (bool, error)) error {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		aerr := attempt(actx)
		if err := poll(5*time.Second, what+" refused", func() (bool, error) { return v.about(subject), nil }); err != nil {
			return fmt.Errorf("%s: no permissions violation for %s (attempt: %v)", what, subject, aerr)
		}
		ok, err := unchanged()
		if err != nil {
			return fmt.Errorf("%s: check: %w", what, err)
		}
		if !ok {
			return fmt.Errorf("%s: refused, yet it took effect", what)
		}
		r.count.Add(1)
		r.note("refused_%s", strings.ReplaceAll(what, " ", "_"))
		return nil
	}

	// A forged result: an admin subscriber must not see it.
	seen := make(chan struct{}, 1)
	sub, err := s.nc.Subscribe(wire.ResultSubject, func(m *nats.Msg) {
		if strings.Contains(string(m.Data), "forged") {
			seen <- struct{}{}
		}
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := s.nc.Flush(); err != nil {
		return err
	}
	if err := refused("publish results", wire.ResultSubject, func(context.Context) error {
		if err := nc.Publish(wire.ResultSubject, []byte(`{"results":[{"request_id":"forged"}]}`)); err != nil {
			return err
		}
		return nc.Flush()
	}, func() (bool, error) {
		select {
		case <-seen:
			return false, nil
		case <-time.After(500 * time.Millisecond):
			return true, nil
		}
	}); err != nil {
		return err
	}

	// A view that would answer SOLD_OUT forever.
	viewKey := "424242"
	if err := refused("put view", "$KV."+wire.ViewBucket+"."+viewKey, func(ctx context.Context) error {
		kv, err := js.KeyValue(ctx, wire.ViewBucket)
		if err != nil {
			return err
		}
		_, err = kv.Put(ctx, viewKey, []byte(`{"seq":18446744073709551615}`))
		return err
	}, func() (bool, error) { return s.keyAbsent(wire.ViewBucket, viewKey) }); err != nil {
		return err
	}

	// A fake allocator that would take a share of the partitions.
	if err := refused("write membership", "$KV."+bus.MembersBucket+".fake", func(ctx context.Context) error {
		_, err := nc.Request("$KV."+bus.MembersBucket+".fake", []byte("{}"), time.Second)
		return err
	}, func() (bool, error) { return s.keyAbsent(bus.MembersBucket, "fake") }); err != nil {
		return err
	}

	// Delete the request stream.
	if err := refused("delete stream", "$JS.API.STREAM.DELETE."+wire.RequestStream, func(ctx context.Context) error {
		return js.DeleteStream(ctx, wire.RequestStream)
	}, func() (bool, error) {
		_, err := s.js.Stream(ctx, wire.RequestStream)
		return err == nil, nil
	}); err != nil {
		return err
	}
	return nil
}

// flowUnderPermissions runs, through ingest, what the burst does not:
// a claim on a full activity shed from the view (the
// allocator's view put, ingest's watch), and a hold that lapses: its
// expiry is scheduled on ALLOT_HOLDS by the allocator, stored by the
// server when due, sourced into ALLOT_REQUESTS and applied, promoting the
// waiter.
func (s *stack) flowUnderPermissions(t *testing.T, m *summary) {
	t.Helper()
	ctx := context.Background()
	do := func(method, path, body string) answer {
		a := s.send(ctx, request{method: method, path: path, body: body, wait: "20s"})
		if a.err != nil || a.state != "done" {
			t.Fatalf("%s %s: %+v, want done", method, path, a)
		}
		return a
	}
	const full, held = 1101, 1102
	if a := do(http.MethodPut, fmt.Sprintf("/v1/activities/%d", full), `{"capacity": 1}`); a.outcome != "OPENED" {
		t.Fatalf("open %d: %+v", full, a)
	}
	if a := do(http.MethodPost, fmt.Sprintf("/v1/activities/%d/signups/1", full), ""); a.outcome != string(wire.OutcomeConfirmed) {
		t.Fatalf("join %d/1: %+v", full, a)
	}
	shed := false
	for u := 2; u < 200 && !shed; u++ {
		a := do(http.MethodPost, fmt.Sprintf("/v1/activities/%d/claims/%d", full, u), "")
		if a.outcome != string(wire.OutcomeSoldOut) {
			t.Fatalf("claim %d/%d: %+v, want SOLD_OUT", full, u, a)
		}
		shed = a.shed
	}
	if !shed {
		t.Errorf("no claim on the full activity %d was shed from the view", full)
	}
	if a := do(http.MethodPut, fmt.Sprintf("/v1/activities/%d", held), `{"capacity": 1, "hold": "1s"}`); a.outcome != "OPENED" {
		t.Fatalf("open %d: %+v", held, a)
	}
	if a := do(http.MethodPost, fmt.Sprintf("/v1/activities/%d/signups/1", held), ""); a.outcome != string(wire.OutcomeHeld) {
		t.Fatalf("join %d/1: %+v, want HELD", held, a)
	}
	if a := do(http.MethodPost, fmt.Sprintf("/v1/activities/%d/signups/2", held), ""); a.outcome != string(wire.OutcomeWaiting) {
		t.Fatalf("join %d/2: %+v, want WAITLISTED", held, a)
	}
	s.must(poll(60*time.Second, "the hold of user 1 lapsed and promoted user 2", func() (bool, error) {
		n := s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND op = 'expire' AND outcome = 'EXPIRED'", held)
		w := s.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND user_id = 2 AND status = 'HELD'", held)
		return n >= 1 && w == 1, nil
	}))
	m.notes = append(m.notes, "shed_claim=ok", "hold_expiry=ok")
}

// keyAbsent reports, as admin, whether bucket holds no key.
func (s *stack) keyAbsent(bucket, key string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := s.js.KeyValue(ctx, bucket)
	if err != nil {
		return false, err
	}
	_, err = kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return true, nil
	}
	return false, err
}

// notifyAsNotifier runs the notifier as the notifier user against a
// webhook that always fails, with one attempt per event: it must read
// events and write their dead letters. It returns the dead letters seen.
func (s *stack) notifyAsNotifier(t *testing.T) int {
	t.Helper()
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer hook.Close()
	nc, err := bus.Connect(s.roleURL("notifier"), "notifier", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("connect as notifier: %v", err)
	}
	defer nc.Close()
	ncfg := config.Defaults[notifier.Config]()
	ncfg.URL, ncfg.Filter, ncfg.MaxAttempts, ncfg.BackoffBase = notifier.SecretURL(hook.URL), "alloc.evt.>", 1, time.Millisecond
	n, err := notifier.New(ncfg, notifier.Deps{NC: nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
		Test: notifier.TestHooks{PollWait: 100 * time.Millisecond}})
	if err != nil {
		t.Fatalf("notifier as the notifier user: %v", err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatalf("start the notifier as the notifier user: %v", err)
	}
	defer n.Stop()
	var got uint64
	err = poll(30*time.Second, "dead letters written by the notifier user", func() (bool, error) {
		st, err := s.js.Stream(context.Background(), notifier.DLQStream)
		if err != nil {
			return false, nil
		}
		info, err := st.Info(context.Background())
		if err != nil {
			return false, nil
		}
		got = info.State.Msgs
		return got >= 10, nil
	})
	if err != nil {
		t.Errorf("the notifier user: %v (%d dead letters)", err, got)
	}
	return int(got)
}

// ingestMetric is the value of the unlabelled series name on ingest's
// /metrics ("" when absent).
func (s *stack) ingestMetric(t *testing.T, name string) string {
	t.Helper()
	resp, err := s.http.Get(s.ingestURL + "/metrics")
	if err != nil {
		t.Errorf("ingest /metrics: %v", err)
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("ingest /metrics: %v", err)
		return ""
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
