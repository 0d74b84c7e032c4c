package ingest

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/ingest/publish"
	"github.com/allot-dev/allot/internal/ingest/reads"
	"github.com/allot-dev/allot/internal/ingest/reply"
	"github.com/allot-dev/allot/internal/ingest/results"
	"github.com/allot-dev/allot/internal/ingest/ui"
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
		if res, ok := s.shed.Recorded(id); ok && mine(res.UserID) {
			// Shed here: its answer needs no shard.
			reply.Result(w, http.StatusOK, res)
			return
		}
		s.dbError(ctx, w, "read result", "request", err, slog.String("request_id", id))
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
	sh, err := s.rd.Activity(activity)
	if err != nil {
		s.dbError(ctx, w, "route activity", "activity", s.rd.Unrouted(err), slog.Int64("activity_id", activity))
		return
	}
	qctx, cancel := context.WithTimeout(ctx, s.deps.Test.queryTimeout())
	defer cancel()
	st, found, err := store.GetActivity(qctx, sh.DB, activity)
	if err != nil {
		s.dbError(ctx, w, "read activity", "activity", s.rd.Fail(ctx, sh, err), slog.Int64("activity_id", activity))
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
	sh, err := s.rd.Activity(activity)
	if err != nil {
		s.dbError(ctx, w, "route signup", "activity", s.rd.Unrouted(err), slog.Int64("activity_id", activity), slog.Int64("user_id", user))
		return
	}
	qctx, cancel := context.WithTimeout(ctx, s.deps.Test.queryTimeout())
	defer cancel()
	st, found, err := sh.Positions.Get(qctx, activity, user)
	if err != nil {
		s.dbError(ctx, w, "read signup", "activity", s.rd.Fail(ctx, sh, err), slog.Int64("activity_id", activity), slog.Int64("user_id", user))
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
// left, which is the cause rather than a failure. With several shards the
// sentence names the shard that holds the activity (or request, as
// holder says) and Retry-After comes with it; with one it is the
// sentence of a deployment without shards.
func (s *Service) dbError(ctx context.Context, w http.ResponseWriter, what, holder string, err error, attrs ...slog.Attr) {
	if ctx.Err() == nil {
		args := make([]any, 0, len(attrs)+1)
		for _, a := range attrs {
			args = append(args, a)
		}
		args = append(args, slog.Any("err", err))
		s.deps.Log.ErrorContext(ctx, what, args...)
	}
	se, ok := errors.AsType[*reads.ShardError](err)
	if !ok || se.Single {
		reply.Error(w, http.StatusServiceUnavailable, reply.MsgDatabaseDown)
		return
	}
	reply.RetryAfter(w, shardRetryAfter)
	reply.Error(w, http.StatusServiceUnavailable, shardDownSentence(se.Shard, holder))
}

// shardRetryAfter is the Retry-After of a read whose shard does not
// answer: shard pings are kept for a second, and a restart takes a few.
const shardRetryAfter = 5 * time.Second

// shardDownSentence is the answer to a read of an activity (or a
// request's result) whose shard does not answer, or cannot be told
// (shard "").
func shardDownSentence(shard, holder string) string {
	what := "this activity"
	if holder == "request" {
		what = "this request's result"
	}
	if shard == "" {
		return "The shard map does not place " + what + " on a database shard this ingest knows; try again shortly."
	}
	return "The database shard " + shard + " that holds " + what + " does not answer; try again shortly."
}

// locate names the shards that may hold request id's result: the shard
// of the partition the id names, or every shard for an id that names
// none (minted before ids named their partition, or by another tool).
func (s *Service) locate(id string) ([]*reads.Shard, error) {
	if s.rd.Single() {
		return s.rd.Shards(), nil
	}
	uid, err := uuid.Parse(id)
	if err != nil {
		return s.rd.Shards(), nil
	}
	if p, ok := s.callers.ids.Partition(uid, s.rd.Partitions()); ok {
		sh, err := s.rd.Partition(p)
		if err != nil {
			return nil, err
		}
		return []*reads.Shard{sh}, nil
	}
	return s.rd.Shards(), nil
}

// uiRoute is the operator page's way to the shard of an activity.
func (s *Service) uiRoute(activity int64) (ui.Shard, error) {
	sh, err := s.rd.Activity(activity)
	if err != nil {
		return ui.Shard{}, err
	}
	return ui.Shard{Name: sh.Name, DB: sh.DB}, nil
}

// uiShards is every shard and whether it answers, for the operator page.
func (s *Service) uiShards(ctx context.Context) []ui.ShardState {
	states := s.rd.Probe(ctx)
	out := make([]ui.ShardState, len(states))
	for i, st := range states {
		out[i] = ui.ShardState{Name: st.Name, Up: st.Up}
	}
	return out
}

var statusOK = []byte(`{"status":"ok"}`)

// handleHealth serves /healthz: the process answers.
func (s *Service) handleHealth(w http.ResponseWriter, _ *http.Request) {
	reply.Raw(w, http.StatusOK, statusOK)
}

// readyBody is /readyz's 200 answer with several shards: each shard's
// state ("up" or "down") by name.
type readyBody struct {
	Status string            `json:"status"`
	Shards map[string]string `json:"shards"`
}

// handleReady serves /readyz: 200 when NATS is connected and at least one
// MySQL shard answers a ping, listing each shard's state when there are
// several; else 503 naming
// what is down (api/openapi.yaml's /readyz). A shard down stops only
// reads of its activities, so it does not make the instance unready.
// Writes do not wait on it: they never touch MySQL, so an instance whose
// database is down still answers them 202, and only the reads that need
// MySQL answer 503. A load balancer that should keep sending writes
// through a database outage probes /healthz instead.
func (s *Service) handleReady(w http.ResponseWriter, r *http.Request) {
	if !s.deps.NATS.IsConnected() {
		reply.Error(w, http.StatusServiceUnavailable, "Not ready: NATS is not connected.")
		return
	}
	body := readyBody{Status: "ok", Shards: map[string]string{}}
	var down []string
	for _, st := range s.rd.Probe(r.Context()) {
		if st.Up {
			body.Shards[st.Name] = "up"
		} else {
			body.Shards[st.Name] = "down"
			down = append(down, st.Name)
		}
	}
	if len(down) == len(body.Shards) {
		if s.rd.Single() {
			reply.Error(w, http.StatusServiceUnavailable, "Not ready: MySQL does not answer.")
		} else {
			reply.Error(w, http.StatusServiceUnavailable, "Not ready: no MySQL shard answers ("+strings.Join(down, ", ")+").")
		}
		return
	}
	if s.rd.Single() {
		reply.Raw(w, http.StatusOK, statusOK) // as before shards
		return
	}
	reply.JSON(w, http.StatusOK, body)
}
