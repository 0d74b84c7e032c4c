package ingest

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/ingest/publish"
	"github.com/allot-dev/allot/internal/ingest/reply"
	"github.com/allot-dev/allot/internal/ingest/results"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// handlePoll serves GET /v1/requests/{request_id}: the recorded result
// (done), or pending for an id ingest issued, or 404. MySQL is read before
// the checksum is checked, so that results of requests other tools published
// are readable too.
func (s *Service) handlePoll(w http.ResponseWriter, r *http.Request) {
	uid, id, err := parseRequestID(r.PathValue("request_id"))
	if err != nil {
		reply.Input(w, err)
		return
	}
	wait, err := parseWait(r.URL.RawQuery, MaxWait)
	if err != nil {
		reply.Input(w, err)
		return
	}
	ctx := r.Context()
	// Beyond MaxWaiters, this poll answers at once with what is known
	// (the poll always answers 200, pending or done).
	wait = s.results.Admit(wait)
	// Register before the MySQL read: a result committed between the read
	// and a later registration would otherwise wake no one.
	var wt *results.Waiter
	if wait > 0 {
		wt = s.results.Register(id)
		defer s.results.Unregister(id, wt)
	}
	// Another user's request reads exactly as an id never issued: 404
	// with the same sentence, so that a request's existence does not leak.
	who, authed := access.Caller(ctx)
	unknown := func() {
		reply.Error(w, http.StatusNotFound, "Request "+id+" is unknown: ingest never issued it.")
	}
	mine := func(user int64) bool { return !authed || who.ActsFor(user) }
	// A void records the user only when the one who asked for it knew
	// it; the owner tag of the id tells the owner in any case.
	visible := func(r wire.Result) bool {
		return mine(r.UserID) || r.Op == wire.OpVoid && who.User != 0 && s.callers.ids.Owned(uid, who.User)
	}
	res, found, err := s.results.Get(ctx, id)
	if err != nil {
		s.dbError(ctx, w, "read result", err, slog.String("request_id", id))
		return
	}
	if found {
		if !visible(res) {
			unknown()
			return
		}
		reply.Result(w, http.StatusOK, res)
		return
	}
	if res, ok := s.shed.Recorded(id); ok {
		// Shed here and not yet recorded by the allocator.
		if !mine(res.UserID) {
			unknown()
			return
		}
		reply.Result(w, http.StatusOK, res)
		return
	}
	// A pending id's owner is known only from its owner tag (access.IDIssuer).
	if !s.callers.ids.Issued(uid) || (authed && !who.Admin && (who.User == 0 || !s.callers.ids.Owned(uid, who.User))) {
		unknown()
		return
	}
	if window, parts := s.pub.Settings(); time.Since(publish.IDTime(uid)) > publish.VoidAfter(window) {
		// Pending past the bound: whatever the issuing ingest did (it may
		// have died), no copy can come inside the duplicate window any
		// more; a void settles the id in its partition's order.
		if p, ok := s.callers.ids.Partition(uid, parts); ok {
			var user int64
			if authed && !who.Admin {
				user = who.User
			}
			s.pub.PollVoid(id, user, p)
		}
	}
	if wait > 0 {
		if res, ok := s.results.Await(ctx, id, wt, wait, false); ok {
			if !visible(res) {
				unknown()
				return
			}
			reply.Result(w, http.StatusOK, res)
			return
		}
	}
	reply.Raw(w, http.StatusOK, reply.Pending(id))
}

// handleActivity serves GET /v1/activities/{activity}.
func (s *Service) handleActivity(w http.ResponseWriter, r *http.Request) {
	activity, err := reply.ParseID(r.PathValue("activity"), "activity")
	if err != nil {
		reply.Input(w, err)
		return
	}
	ctx := r.Context()
	if !s.callers.access.AllowRead(w, r, 0) {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, s.deps.Test.queryTimeout())
	defer cancel()
	st, found, err := store.GetActivity(qctx, s.deps.DB, activity)
	if err != nil {
		s.dbError(ctx, w, "read activity", err, slog.Int64("activity_id", activity))
		return
	}
	if !found {
		reply.Error(w, http.StatusNotFound, "Activity "+strconv.FormatInt(activity, 10)+" was never opened.")
		return
	}
	reply.JSON(w, http.StatusOK, st)
}

// handleSignup serves GET /v1/activities/{activity}/signups/{user}.
func (s *Service) handleSignup(w http.ResponseWriter, r *http.Request) {
	activity, err := reply.ParseID(r.PathValue("activity"), "activity")
	if err != nil {
		reply.Input(w, err)
		return
	}
	user, err := reply.ParseID(r.PathValue("user"), "user")
	if err != nil {
		reply.Input(w, err)
		return
	}
	ctx := r.Context()
	if !s.callers.access.AllowRead(w, r, user) {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, s.deps.Test.queryTimeout())
	defer cancel()
	st, found, err := s.posns.Get(qctx, activity, user)
	if err != nil {
		s.dbError(ctx, w, "read signup", err, slog.Int64("activity_id", activity), slog.Int64("user_id", user))
		return
	}
	if !found {
		reply.Error(w, http.StatusNotFound, "User "+strconv.FormatInt(user, 10)+
			" never signed up for activity "+strconv.FormatInt(activity, 10)+".")
		return
	}
	reply.JSON(w, http.StatusOK, st)
}

// dbError answers 503 for a failed MySQL read and logs it, unless the client
// left, which is the cause rather than a failure.
func (s *Service) dbError(ctx context.Context, w http.ResponseWriter, what string, err error, attrs ...slog.Attr) {
	if ctx.Err() == nil {
		args := make([]any, 0, len(attrs)+1)
		for _, a := range attrs {
			args = append(args, a)
		}
		args = append(args, slog.Any("err", err))
		s.deps.Log.ErrorContext(ctx, what, args...)
	}
	reply.Error(w, http.StatusServiceUnavailable, reply.MsgDatabaseDown)
}

var statusOK = []byte(`{"status":"ok"}`)

// handleHealth serves /healthz: the process answers.
func (s *Service) handleHealth(w http.ResponseWriter, _ *http.Request) {
	reply.Raw(w, http.StatusOK, statusOK)
}

// handleReady serves /readyz: 200 when NATS is connected and MySQL answers
// a ping, else 503 naming which (api/openapi.yaml's /readyz).
// Writes do not wait on it: they never touch MySQL, so an instance whose
// database is down still answers them 202, and only the reads that need
// MySQL answer 503. A load balancer that should keep sending writes
// through a database outage probes /healthz instead.
func (s *Service) handleReady(w http.ResponseWriter, r *http.Request) {
	if !s.deps.NATS.IsConnected() {
		reply.Error(w, http.StatusServiceUnavailable, "Not ready: NATS is not connected.")
		return
	}
	if err := s.state.dbUp.check(r.Context()); err != nil {
		reply.Error(w, http.StatusServiceUnavailable, "Not ready: MySQL does not answer.")
		return
	}
	reply.Raw(w, http.StatusOK, statusOK)
}

// dbProbe pings MySQL for /readyz. /readyz needs no token, so a ping's
// answer is kept for a second and pings never overlap: a flood of probes
// costs the database one ping a second.
type dbProbe struct {
	db      *sql.DB
	timeout time.Duration

	mu  sync.Mutex
	at  time.Time
	err error
}

func (p *dbProbe) check(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.at.IsZero() && time.Since(p.at) < time.Second {
		return p.err
	}
	pctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	err := p.db.PingContext(pctx)
	if err != nil && ctx.Err() != nil {
		return err // the caller went away: no answer to keep
	}
	p.at, p.err = time.Now(), err
	return err
}
