package baseline

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/wire"
)

// The designs Handler serves.
const (
	DesignClaim = "claim" // SeedClaim
	DesignGated = "gated" // GatedClaim
	DesignJoin  = "join"  // SeedJoin and SeedCancel
	DesignFloor = "floor" // Floor: claims counted in memory, nothing stored
)

// ErrUnknownDesign is returned by Handler for a design it does not know.
var ErrUnknownDesign = errors.New("baseline: unknown design (want claim, gated, join or floor)")

// Server serves one design over allot's routes. It is synchronous: every
// write is applied before it is answered, with 200 and a done result, so
// ?wait= is accepted and ignored and no request is ever pending.
type Server struct {
	design string
	db     *sql.DB
	redis  *Redis
	gate   *Gate
	floor  *Floor
	mux    *http.ServeMux
	log    *slog.Logger
}

// Handler returns the HTTP handler of design (DesignClaim, DesignGated,
// DesignJoin or DesignFloor) over db, after creating the seed tables. The
// gated design connects to Redis at redisAddr; the others ignore it. The
// floor uses neither db (which may be nil) nor Redis. The handler is a
// *Server: call its Close to delete its Redis counters and connections.
func Handler(design string, db *sql.DB, redisAddr string) (http.Handler, error) {
	return NewServer(design, db, redisAddr, nil)
}

// NewServer is Handler with a logger for failures (nil discards them).
func NewServer(design string, db *sql.DB, redisAddr string, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{design: design, db: db, mux: http.NewServeMux(), log: log}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch design {
	case DesignClaim, DesignJoin:
	case DesignGated:
		r, err := DialRedis(ctx, redisAddr, DefaultRedisPool)
		if err != nil {
			return nil, err
		}
		s.redis, s.gate = r, NewGate(r, "")
	case DesignFloor:
		s.floor = NewFloor()
	default:
		return nil, fmt.Errorf("%w: %q", ErrUnknownDesign, design)
	}
	if s.floor == nil { // the floor stores nothing: no tables
		if err := Migrate(ctx, db); err != nil {
			s.Close()
			return nil, err
		}
	}
	s.mux.HandleFunc("PUT /v1/activities/{a}", s.handleOpen)
	s.mux.HandleFunc("GET /v1/activities/{a}", s.handleState)
	if design == DesignJoin {
		s.mux.HandleFunc("POST /v1/activities/{a}/signups/{u}", s.handleJoin)
		s.mux.HandleFunc("DELETE /v1/activities/{a}/signups/{u}", s.handleCancel)
	} else {
		s.mux.HandleFunc("POST /v1/activities/{a}/claims/{u}", s.handleClaim)
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "No route matches this path in the "+design+" baseline.")
	})
	return s, nil
}

// ServeHTTP serves the routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close deletes the gate's counters and closes the Redis connections. The
// database belongs to the caller.
func (s *Server) Close() error {
	if s.gate == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.gate.Close(ctx)
	return errors.Join(err, s.redis.Close())
}

func (s *Server) handleOpen(w http.ResponseWriter, r *http.Request) {
	a, ok := pathID(w, r, "a", "activity")
	if !ok {
		return
	}
	var body struct {
		Capacity *int64 `json:"capacity"`
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil || json.Unmarshal(data, &body) != nil || body.Capacity == nil {
		writeError(w, http.StatusBadRequest, `The body must be JSON like {"capacity": 100}.`)
		return
	}
	c := *body.Capacity
	if c < 0 || c > wire.MaxCapacity {
		writeError(w, http.StatusBadRequest, "The capacity must be from 0 to 10000000.")
		return
	}
	ctx := r.Context()
	var existed bool
	switch {
	case s.floor != nil:
		existed = s.floor.Set(a, c)
	case s.design == DesignJoin:
		existed, err = ResetActivity(ctx, s.db, a, c)
	default:
		existed, err = ResetStock(ctx, s.db, a, c)
		if err == nil && s.gate != nil {
			err = s.gate.Set(ctx, a, c)
		}
	}
	if err != nil {
		s.fail(w, r, "open", err)
		return
	}
	// Opening resets: a baseline run starts from an empty activity.
	outcome := string(wire.OutcomeOpened)
	if existed {
		outcome = string(wire.OutcomeResized)
	}
	res := result(string(wire.OpOpen), a, 0, outcome, "")
	res.Capacity = &c
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) handleState(w http.ResponseWriter, r *http.Request) {
	a, ok := pathID(w, r, "a", "activity")
	if !ok {
		return
	}
	var st State
	var err error
	switch {
	case s.floor != nil:
		var ok bool
		if st, ok = s.floor.State(a); !ok {
			err = ErrNotFound
		}
	case s.design == DesignJoin:
		st, err = ActivityState(r.Context(), s.db, a)
	default:
		st, err = StockState(r.Context(), s.db, a)
	}
	if errors.Is(err, ErrNotFound) {
		writeError(w, http.StatusNotFound, "Activity "+strconv.FormatInt(a, 10)+" was never opened.")
		return
	}
	if err != nil {
		s.fail(w, r, "state", err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) handleClaim(w http.ResponseWriter, r *http.Request) {
	a, u, ok := pathIDs(w, r)
	if !ok {
		return
	}
	var outcome string
	var err error
	switch {
	case s.floor != nil:
		outcome = s.floor.Claim(a, u)
	case s.gate != nil:
		outcome, err = GatedClaim(r.Context(), s.db, s.gate, a, u)
	default:
		outcome, err = SeedClaim(r.Context(), s.db, a, u)
	}
	if err != nil {
		s.fail(w, r, "claim", err)
		return
	}
	status := ""
	if outcome == string(wire.OutcomeGranted) || outcome == string(wire.OutcomeAlreadyOwned) {
		status = string(wire.StatusConfirmed)
	}
	writeJSON(w, http.StatusOK, result(string(wire.OpClaim), a, u, outcome, status))
}

func (s *Server) handleJoin(w http.ResponseWriter, r *http.Request) {
	a, u, ok := pathIDs(w, r)
	if !ok {
		return
	}
	outcome, err := SeedJoin(r.Context(), s.db, a, u)
	if err != nil {
		s.fail(w, r, "join", err)
		return
	}
	status := ""
	switch outcome {
	case string(wire.OutcomeConfirmed), string(wire.OutcomeAlreadyConfirmed):
		status = string(wire.StatusConfirmed)
	case string(wire.OutcomeWaiting), string(wire.OutcomeAlreadyWaiting):
		status = string(wire.StatusWaiting)
	}
	writeJSON(w, http.StatusOK, result(string(wire.OpJoin), a, u, outcome, status))
}

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) {
	a, u, ok := pathIDs(w, r)
	if !ok {
		return
	}
	outcome, promoted, err := SeedCancel(r.Context(), s.db, a, u)
	if err != nil {
		s.fail(w, r, "cancel", err)
		return
	}
	status := ""
	if outcome == string(wire.OutcomeCancelled) {
		status = string(wire.StatusCancelled)
	}
	res := result(string(wire.OpCancel), a, u, outcome, status)
	if promoted != 0 {
		res.PromotedUserID = &promoted
	}
	writeJSON(w, http.StatusOK, res)
}

// fail answers 503 for a database or Redis failure, which the load
// generator retries, unless the client left.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, what string, err error) {
	if r.Context().Err() == nil {
		s.log.ErrorContext(r.Context(), what, slog.String("design", s.design), slog.Any("err", err))
	}
	writeError(w, http.StatusServiceUnavailable, "The "+what+" failed in the "+s.design+" baseline; retry later.")
}

func result(op string, activity, user int64, outcome, status string) wire.Result {
	res := wire.Result{
		RequestID:  uuid.Must(uuid.NewV7()).String(),
		State:      wire.StateDone,
		Op:         wire.Op(op),
		ActivityID: activity,
		UserID:     user,
		Outcome:    wire.Outcome(outcome),
		AppliedAt:  time.Now().UTC(),
	}
	if status != "" {
		st := wire.Status(status)
		res.Status = &st
	}
	return res
}

func pathIDs(w http.ResponseWriter, r *http.Request) (a, u int64, ok bool) {
	if a, ok = pathID(w, r, "a", "activity"); !ok {
		return 0, 0, false
	}
	u, ok = pathID(w, r, "u", "user")
	return a, u, ok
}

func pathID(w http.ResponseWriter, r *http.Request, name, what string) (int64, bool) {
	raw := r.PathValue(name)
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 1 || raw[0] == '+' {
		writeError(w, http.StatusBadRequest, "The "+what+" id must be a decimal integer from 1 to 9223372036854775807.")
		return 0, false
	}
	return n, true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"An internal error occurred."}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) //nolint:errcheck // the client is gone
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, struct {
		Error string `json:"error"`
	}{msg})
}
