package access

import (
	"context"
	"hash/fnv"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/ingest/reply"
	"github.com/allot-dev/allot/internal/wire"
)

// Config is access's part of ingest's configuration. A rate of 0 (or, for
// OpenRate and BadAuthRate, a negative one) is no limit.
type Config struct {
	RateLimit      float64 // writes per second of this instance (ALLOT_INGEST_RATE_LIMIT)
	RateBurst      int
	UserRate       float64 // writes per second per user (ALLOT_INGEST_USER_RATE)
	UserBurst      int
	OpenRate       float64 // opens and resizes per second (ALLOT_INGEST_OPEN_RATE), burst twice that
	BadAuthRate    float64 // failed authentications per second per address (ALLOT_INGEST_BAD_AUTH_RATE)
	ReadRate       float64 // reads per second per caller (ALLOT_INGEST_READ_RATE)
	ReadBurst      int
	TrustedProxies []netip.Prefix // ALLOT_TRUSTED_PROXIES
}

// Metrics are access's series; ingest registers them.
type Metrics struct {
	AuthFailures *prometheus.CounterVec // reason: missing, invalid, flood
	ReadsLimited prometheus.Counter
}

// Access guards ingest's routes and spends its callers' budgets.
type Access struct {
	auth    *auth.Verifier // nil: no authentication
	log     *slog.Logger
	trusted []netip.Prefix
	badAuth *badAuth      // nil without authentication or with BadAuthRate < 0
	limiter *rate.Limiter // nil when RateLimit is off
	opens   *rate.Limiter // nil when OpenRate < 0
	users   *userLimiter  // nil when UserRate is off
	readers *userLimiter  // nil when ReadRate is off
	m       Metrics
}

// New returns the Access of cfg; v verifies bearer tokens (nil: none).
func New(cfg Config, v *auth.Verifier, log *slog.Logger, m Metrics) *Access {
	a := &Access{auth: v, log: log, trusted: cfg.TrustedProxies, m: m}
	if cfg.OpenRate > 0 {
		a.opens = rate.NewLimiter(rate.Limit(cfg.OpenRate), max(1, int(2*cfg.OpenRate)))
	}
	if cfg.RateLimit > 0 {
		a.limiter = rate.NewLimiter(rate.Limit(cfg.RateLimit), cfg.RateBurst)
	}
	if v != nil && cfg.BadAuthRate > 0 {
		a.badAuth = newBadAuth(cfg.BadAuthRate)
	}
	if cfg.ReadRate > 0 {
		a.readers = newUserLimiter(cfg.ReadRate, cfg.ReadBurst)
	}
	if cfg.UserRate > 0 {
		a.users = newUserLimiter(cfg.UserRate, cfg.UserBurst)
	}
	return a
}

// AllowWrite spends a write of this instance's budget (and an open's, for
// op open), or answers 429 and returns false.
func (a *Access) AllowWrite(w http.ResponseWriter, op wire.Op) bool {
	if a.limiter != nil && !a.limiter.Allow() {
		reply.RetryAfter(w, time.Second)
		reply.Error(w, http.StatusTooManyRequests, reply.MsgRateLimited)
		return false
	}
	if op == wire.OpOpen && a.opens != nil && !a.opens.Allow() {
		reply.RetryAfter(w, time.Second)
		reply.Error(w, http.StatusTooManyRequests, reply.MsgOpenRateLimited)
		return false
	}
	return true
}

// AllowUser spends a write of the caller's per-user budget (limitKey), or
// answers 429 and returns false. Opens are not counted.
func (a *Access) AllowUser(w http.ResponseWriter, r *http.Request, op wire.Op, user int64) bool {
	if a.users != nil && op != wire.OpOpen {
		if ok, wait := a.users.allow(limitKey(r.Context(), user), time.Now()); !ok {
			reply.RetryAfter(w, wait)
			reply.Error(w, http.StatusTooManyRequests, reply.MsgUserRateLimited)
			return false
		}
	}
	return true
}

// AllowRead spends a read from the caller's budget, or answers 429 and
// returns false. The caller is the token's subject (never a path segment);
// allot:admin tokens, trusted services that read for every user, are not
// limited. Without authentication the only caller there is to count is the
// path's user of a signup read (user > 0), as for writes; activity reads,
// one primary-key read each, are then not limited (behind a gateway that
// authenticates, every client shares its address).
func (a *Access) AllowRead(w http.ResponseWriter, r *http.Request, user int64) bool {
	if a.readers == nil {
		return true
	}
	who, authed := Caller(r.Context())
	if authed && who.Admin || !authed && user <= 0 {
		return true
	}
	ok, wait := a.readers.allow(limitKey(r.Context(), user), time.Now())
	if !ok {
		a.m.ReadsLimited.Inc()
		reply.RetryAfter(w, wait)
		reply.Error(w, http.StatusTooManyRequests, reply.MsgReadRateLimited)
	}
	return ok
}

// limitKey is whose per-user write budget a write spends: the caller's
// subject when authentication is on (so that changing the path's user
// changes nothing), else the path's user.
func limitKey(ctx context.Context, user int64) int64 {
	id, ok := Caller(ctx)
	if !ok {
		return user
	}
	if id.User != 0 {
		return id.User
	}
	h := fnv.New64a()
	h.Write([]byte(id.Subject))
	return -int64(h.Sum64()>>1) - 1 // negative: never a user id
}
