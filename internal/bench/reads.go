package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/waitlist"
	"github.com/allot-dev/allot/internal/wire"
)

// ReadsConfig describes one run of the reads benchmark.
type ReadsConfig struct {
	Waiters  int           // the line of the hot activity before the drain
	Joins    int           // the join backlog drained meanwhile
	Readers  int           // concurrent readers through HTTP
	Interval time.Duration // each reader's pause between two reads (0: none)
	Window   time.Duration // each measured drain window (default 10s)
	// OldReads is how many reads the old way (a COUNT(*) over the line
	// ahead) are timed for comparison, one at a time; 0: none.
	OldReads  int
	Allocator allocator.Config
	// IngestURL, when set, is an ingest already serving (its own
	// process, as deployed) whose tokens HS256Key signs; else one is
	// started in this process.
	IngestURL string
	HS256Key  []byte
	// Progress, when set, is told what is done as it goes.
	Progress func(format string, args ...any)
}

// ReadsResult is what a reads run measured, in one run.
type ReadsResult struct {
	Waiters int
	// The drain of the join backlog over two windows of the same run: no
	// reader, then every reader reading.
	Quiet, Loud   DrainResult
	Reads         []time.Duration // every read of the loud window
	ReadErrors    int             // reads that did not answer 200
	ActivityReads int
	SignupReads   int
	OldRead       []time.Duration // reads the old way, one at a time
	// Direct reads of the store, one at a time, before the drain: what
	// one read costs MySQL with nothing else running.
	DirectActivity, DirectSignup []time.Duration
	SeedElapsed                  time.Duration
	LastPosition                 int64 // the last reader's position, as read
}

// ReadsPerSecond is the loud window's read rate.
func (r ReadsResult) ReadsPerSecond() float64 {
	return float64(len(r.Reads)) / r.Loud.Elapsed.Seconds()
}

// Percentile is the p-th percentile (0..1) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

const readsActivity = 1

// Reads measures what reads cost the allocator: Waiters wait on one
// activity (seeded straight into MySQL, with the counters and waitlist
// buckets the allocator would have written, and the stream and fence moved
// past their sequences), a backlog of Joins to it is drained by a real
// allocator, and its rate is measured over a window without readers and a
// window with Readers reading the activity's state and their own positions
// through a real ingest over HTTP, with bearer tokens (the read limit set
// so high that it never answers 429). db and nc must be empty of allot
// state; readDB is ingest's own pool on the same database.
func Reads(ctx context.Context, db, readDB *sql.DB, nc *nats.Conn, log *slog.Logger, cfg ReadsConfig) (ReadsResult, error) {
	res := ReadsResult{Waiters: cfg.Waiters}
	if cfg.Window <= 0 {
		cfg.Window = 10 * time.Second
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return res, err
	}
	if err := bus.EnsureStreams(ctx, js, config.Defaults[bus.Config]()); err != nil {
		return res, err
	}
	start := time.Now()
	next, err := seedLine(ctx, db, cfg.Waiters)
	if err != nil {
		return res, fmt.Errorf("seed: %w", err)
	}
	stream, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		return res, err
	}
	// The stream continues where the seeded requests would have left it.
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(next)); err != nil {
		return res, fmt.Errorf("move the stream to seq %d: %w", next, err)
	}
	res.SeedElapsed = time.Since(start)
	progress := cfg.Progress
	if progress == nil {
		progress = func(string, ...any) {}
	}
	progress("seeded %d waiters in %s", cfg.Waiters, res.SeedElapsed.Round(time.Millisecond))
	for i := range 200 {
		t := time.Now()
		if _, _, err := store.GetActivity(ctx, readDB, readsActivity); err != nil {
			return res, err
		}
		res.DirectActivity = append(res.DirectActivity, time.Since(t))
		u := int64(seedConfirmed) + 1 + int64(i)*int64(max(1, cfg.Waiters/200))
		t = time.Now()
		if _, _, err := store.GetSignup(ctx, readDB, readsActivity, u); err != nil {
			return res, err
		}
		res.DirectSignup = append(res.DirectSignup, time.Since(t))
	}
	start = time.Now()

	// The backlog, before the allocator starts, so the drain is the
	// allocator's pace; in atomic batches (one fsync each), as ingest's
	// group commit publishes under load.
	now := time.Now().UTC()
	first := int64(cfg.Waiters) + 1_000_000
	for lo := 0; lo < cfg.Joins; lo += bus.MaxAtomicBatch {
		var (
			msgs []*nats.Msg
			ids  []string
		)
		for i := lo; i < min(lo+bus.MaxAtomicBatch, cfg.Joins); i++ {
			r := wire.Request{RequestID: uuid.Must(uuid.NewV7()).String(), Op: wire.OpJoin, ActivityID: readsActivity,
				UserID: first + int64(i), ReceivedAt: now}
			data, err := json.Marshal(r)
			if err != nil {
				return res, err
			}
			msgs = append(msgs, &nats.Msg{Subject: wire.RequestSubject(readsActivity), Data: data})
			ids = append(ids, r.RequestID)
		}
		if _, err := bus.PublishAtomic(nc, wire.RequestStream, msgs, ids, time.Minute); err != nil {
			return res, fmt.Errorf("publish the backlog: %w", err)
		}
	}
	last, err := lastSeq(ctx, js)
	if err != nil {
		return res, err
	}
	progress("published %d joins in %s", cfg.Joins, time.Since(start).Round(time.Millisecond))

	key, base := cfg.HS256Key, cfg.IngestURL
	if base == "" {
		key = []byte("allot-bench-reads-hs256-key-0123456789")
		v, err := auth.New(auth.Config{HS256Key: key})
		if err != nil {
			return res, err
		}
		defer v.Close()
		icfg := config.Defaults[ingest.Config]()
		icfg.ReadRate, icfg.UserRate = 1e9, 0 // reads unlimited; no write limit, as before
		svc, err := ingest.New(icfg, ingest.Deps{DB: readDB, NATS: nc, JS: js, Log: log, Registry: prometheus.NewRegistry(), Verifier: v})
		if err != nil {
			return res, err
		}
		if err := svc.Start(ctx); err != nil {
			return res, err
		}
		defer svc.Stop()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return res, err
		}
		srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln) //nolint:errcheck // ends with Close
		defer srv.Close()
		base = "http://" + ln.Addr().String()
	}

	a, err := allocator.New(allocatorConfig(cfg.Allocator), allocator.Deps{DB: db, NATS: nc, Log: log})
	if err != nil {
		return res, err
	}
	if err := a.Start(ctx); err != nil {
		return res, err
	}
	defer a.Stop()
	// The first batch loads the line into the allocator; measure after it.
	start = time.Now()
	if err := waitFence(ctx, db, 0, next+uint64(allocatorConfig(cfg.Allocator).BatchSize), 5*time.Minute); err != nil {
		return res, err
	}
	progress("the allocator loaded the line in %s", time.Since(start).Round(time.Millisecond))
	fence := func() (uint64, error) {
		var f uint64
		err := db.QueryRowContext(ctx, "SELECT last_seq FROM allocator_partition WHERE partition_id = 0").Scan(&f)
		return f, err
	}
	window := func(d time.Duration, during func(stop <-chan struct{})) (DrainResult, error) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		if during != nil {
			wg.Go(func() { during(stop) })
		}
		f0, err := fence()
		t0 := time.Now()
		if err == nil {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		f1, err2 := fence()
		elapsed := time.Since(t0)
		close(stop)
		wg.Wait()
		if err = errors.Join(err, err2); err != nil {
			return DrainResult{}, err
		}
		if f1 >= last {
			return DrainResult{}, fmt.Errorf("the backlog ran out within the window (fence %d of %d): raise the joins", f1, last)
		}
		return DrainResult{Decisions: int(f1 - f0), Elapsed: elapsed}, nil
	}
	// The readers: reader i is a waiter spread over the line, with its own
	// token, and reads its position or the activity's state in turn.
	type reader struct {
		user int64
		tok  string
	}
	readers := make([]reader, cfg.Readers)
	for i := range readers {
		u := int64(seedConfirmed) + 1 + int64(i)*int64(max(1, cfg.Waiters/max(1, cfg.Readers)))
		tok, err := auth.MintHS256(key, auth.Claims{Subject: strconv.FormatInt(u, 10), TTL: time.Hour})
		if err != nil {
			return res, err
		}
		readers[i] = reader{user: u, tok: tok}
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Readers}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	read := func(stop <-chan struct{}) {
		var wg sync.WaitGroup
		for i, rd := range readers {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(i), 1))
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					path := "/v1/activities/" + strconv.Itoa(readsActivity)
					signup := (n+i)%2 == 1
					if signup {
						path += "/signups/" + strconv.FormatInt(rd.user, 10)
					}
					t := time.Now()
					code, body, err := get(client, base+path, rd.tok)
					d := time.Since(t)
					mu.Lock()
					res.Reads = append(res.Reads, d)
					if err != nil || code != http.StatusOK {
						res.ReadErrors++
					} else if signup {
						res.SignupReads++
						if i == len(readers)-1 {
							res.LastPosition = jsonField(body, "position")
						}
					} else {
						res.ActivityReads++
					}
					mu.Unlock()
					if cfg.Interval > 0 {
						// Jittered, so the readers do not march in step.
						select {
						case <-stop:
							return
						case <-time.After(cfg.Interval/2 + time.Duration(r.Int64N(int64(cfg.Interval)))):
						}
					}
				}
			})
		}
		wg.Wait()
	}
	// Windows without and with readers alternate, a quarter of each at a
	// time, so that a machine whose load drifts over the run (other work
	// on it) weighs on both alike.
	const rounds = 4
	add := func(to *DrainResult, r DrainResult) {
		to.Decisions += r.Decisions
		to.Elapsed += r.Elapsed
	}
	for i := range rounds {
		q, err := window(cfg.Window/rounds, nil)
		if err != nil {
			return res, fmt.Errorf("window without readers: %w", err)
		}
		l, err := window(cfg.Window/rounds, read)
		if err != nil {
			return res, fmt.Errorf("window with readers: %w", err)
		}
		add(&res.Quiet, q)
		add(&res.Loud, l)
		progress("round %d: %.0f joins/s without readers, %.0f with", i+1, q.PerSecond(), l.PerSecond())
	}
	a.Stop()
	// Reads the old way, for comparison: a COUNT(*) over the line ahead of
	// the last seeded waiter.
	tail := int64(seedConfirmed + cfg.Waiters)
	for range cfg.OldReads {
		t := time.Now()
		if _, _, err := store.GetSignupByCount(ctx, readDB, readsActivity, tail); err != nil {
			return res, err
		}
		res.OldRead = append(res.OldRead, time.Since(t))
	}
	return res, nil
}

// seedConfirmed is how many users hold a seat of the seeded activity.
const seedConfirmed = 100

// seedLine writes the hot activity straight into MySQL: seedConfirmed
// seats taken and waiters waiting, as the allocator would have left them
// after applying an open and those joins at stream sequences 1, 2, …, with
// the counters, the waitlist buckets and the fence. queue_seq and next_seq
// are places (wire.Place), of single requests here. It returns the next
// stream sequence.
func seedLine(ctx context.Context, db *sql.DB, waiters int) (uint64, error) {
	n := seedConfirmed + waiters
	next := uint64(n) + 2 // the open is seq 1
	if _, err := db.ExecContext(ctx, "INSERT INTO activity (id, capacity, confirmed_count, next_seq) VALUES (?, ?, ?, ?)",
		readsActivity, seedConfirmed, seedConfirmed, wire.Place(next-1, 0)+1); err != nil {
		return 0, err
	}
	const chunk = 5000
	for lo := 0; lo < n; lo += chunk {
		var b strings.Builder
		b.WriteString("INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES ")
		for i := lo; i < min(lo+chunk, n); i++ {
			if i > lo {
				b.WriteByte(',')
			}
			status := "WAITING"
			if i < seedConfirmed {
				status = "CONFIRMED"
			}
			fmt.Fprintf(&b, "(%d,%d,'%s',%d)", readsActivity, i+1, status, wire.Place(uint64(i+2), 0))
		}
		if _, err := db.ExecContext(ctx, b.String()); err != nil {
			return 0, err
		}
	}
	if err := waitlist.Rebuild(ctx, db, readsActivity); err != nil {
		return 0, err
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO allocator_partition (partition_id, last_seq) VALUES (0, ?)", next-1); err != nil {
		return 0, err
	}
	return next, nil
}

func get(c *http.Client, url, tok string) (int, []byte, error) {
	r, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	r.Header.Set("Authorization", "Bearer "+tok)
	resp, err := c.Do(r)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, b, err
}

// jsonField reads an integer field of a flat JSON object, 0 if absent.
func jsonField(body []byte, name string) int64 {
	_, rest, ok := strings.Cut(string(body), `"`+name+`":`)
	if !ok {
		return 0
	}
	end := strings.IndexAny(rest, ",}")
	if end < 0 {
		return 0
	}
	n, _ := strconv.ParseInt(rest[:end], 10, 64)
	return n
}
