// Package ui owns ingest's live operator page: the page itself (HTML, CSS
// and JavaScript embedded in the binary, no build step, no framework) and
// the feed it watches, a server-sent-events stream of one activity's state
// and events. Package ingest mounts it at GET /, GET /ui/{asset} and
// GET /v1/activities/{activity}/live.
//
// The feed reads what the rest of allot already writes: the activity's
// counters from MySQL (store.GetActivity) and its events from ALLOT_EVENTS
// through one ordered consumer per watching page. It never writes.
package ui

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config.
const (
	DefaultMaxClients    = 100
	DefaultQueryTimeout  = 5 * time.Second
	DefaultSnapshotEvery = 250 * time.Millisecond
	DefaultIdleEvery     = 2 * time.Second
	DefaultWriteTimeout  = 10 * time.Second
	DefaultBuffer        = 4096
)

// Config configures a Server. A zero field takes its default.
type Config struct {
	// DB is read for the activity's state when Route is nil (one
	// database); one of the two is required.
	DB *sql.DB
	// Route, when set, is the shard that holds an activity's state now.
	Route func(activity int64) (Shard, error)
	// Shards, when set, reports every shard and whether it answers; each
	// state shows them.
	Shards func(ctx context.Context) []ShardState
	// JS reads ALLOT_EVENTS (ordered consumers) and the last request stored
	// in ALLOT_REQUESTS for the lag; required.
	JS jetstream.JetStream
	// Log receives the feed's failures; nil discards them.
	Log *slog.Logger
	// Done, when closed, ends every live stream with a "bye" message: the
	// server is shutting down, and an open stream would otherwise hold its
	// graceful shutdown until the timeout. Nil never closes.
	Done <-chan struct{}
	// MaxClients bounds the concurrent live streams; one more answers 503.
	// Default 100.
	MaxClients int
	// QueryTimeout bounds one state read (MySQL and the request stream) and
	// the creation of a stream's consumer. Default 5s.
	QueryTimeout time.Duration
	// SnapshotEvery is the shortest interval between two state snapshots of
	// one stream while events flow. Default 250ms.
	SnapshotEvery time.Duration
	// IdleEvery is the interval of state snapshots while no event flows;
	// they double as keep-alives. Default 2s.
	IdleEvery time.Duration
	// WriteTimeout bounds writing one batch of messages to a client; the
	// connection's write deadline is pushed forward by it before each
	// write, so the server's WriteTimeout does not cut a long stream.
	// Default 10s.
	WriteTimeout time.Duration
	// Buffer is how many events one stream holds for a client that reads
	// slower than they come; beyond it events are skipped (and counted in
	// the state's "skipped"), never queued without bound. Default 4096.
	Buffer int
}

func (c Config) withDefaults() (Config, error) {
	if (c.DB == nil && c.Route == nil) || c.JS == nil {
		return c, errors.New("ui: Config needs a database and a JetStream handle")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.MaxClients < 0 || c.QueryTimeout < 0 || c.SnapshotEvery < 0 || c.IdleEvery < 0 || c.WriteTimeout < 0 || c.Buffer < 0 {
		return c, errors.New("ui: Config values must not be negative")
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.QueryTimeout, DefaultQueryTimeout)
	def(&c.SnapshotEvery, DefaultSnapshotEvery)
	def(&c.IdleEvery, DefaultIdleEvery)
	def(&c.WriteTimeout, DefaultWriteTimeout)
	if c.MaxClients == 0 {
		c.MaxClients = DefaultMaxClients
	}
	if c.Buffer == 0 {
		c.Buffer = DefaultBuffer
	}
	return c, nil
}

// Shard is a shard an activity's state is read on: its name and pool.
type Shard struct {
	Name string
	DB   *sql.DB
}

// ShardState is one shard as a state shows it: its name and whether it
// answered its last ping.
type ShardState struct {
	Name string `json:"name"`
	Up   bool   `json:"up"`
}

// ShardError is a state read that failed on the shard that holds the
// activity (Shard "" when it could not be told).
type ShardError struct {
	Shard string
	Err   error
}

func (e *ShardError) Error() string { return "shard " + e.Shard + ": " + e.Err.Error() }

func (e *ShardError) Unwrap() error { return e.Err }

// dbDown is the sentence of a failed state read: naming the shard when
// the activity's shard is known.
func dbDown(err error, single string) string {
	if se, ok := errors.AsType[*ShardError](err); ok && se.Shard != "" {
		return "The database shard " + se.Shard + " that holds this activity does not answer; " + single
	}
	return "The database did not answer; " + single
}

// Server serves the page, its assets and the live feed.
type Server struct {
	cfg     Config
	slots   chan struct{} // one token per live stream
	clients atomic.Int64
	snaps   snapshots

	mu        sync.Mutex
	reqStream jetstream.Stream // ALLOT_REQUESTS, looked up once
	parts     int              // its partitions
}

// New returns a Server; it does no I/O.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Server{
		cfg:   cfg,
		slots: make(chan struct{}, cfg.MaxClients),
		snaps: snapshots{m: make(map[int64]*snapEntry)},
	}, nil
}

// Clients is the number of live streams being served.
func (s *Server) Clients() int { return int(s.clients.Load()) }

// Sentences of the feed's error answers, in the API's {"error": ...} form.
const (
	msgTooMany      = "Too many live pages are open on this server; retry after the time in the Retry-After header."
	msgBrokerDown   = "The message broker is unavailable, so the live feed cannot start; retry later."
	msgDatabaseDown = "The database is unavailable; retry later."
	msgNoAsset      = "No route matches this path."
)

func writeError(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client is gone; nothing to do
}
