package ingest

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"net/http"
	"time"

	"github.com/allot-dev/allot/internal/auth"
)

// Who may call what (docs/operations.md, "Authentication"). Each
// route's handler is wrapped in one policy (guard), so that the policy does
// not depend on how the routes are matched.
type policy int

const (
	// public: no token needed (/healthz, /readyz, the page's static shell).
	public policy = iota
	// anyCaller: any valid token (activity state, polls: the poll itself
	// checks the request's owner).
	anyCaller
	// self: the path's {user} must be the token's sub, or allot:admin.
	self
	// admin: allot:admin.
	admin
	// operator: allot:operator (the live feed, /metrics).
	operator
)

// Sentences of the answers of authentication and authorization.
const (
	msgNoToken      = "This request needs a bearer token in the Authorization header."
	msgBadToken     = "The bearer token is invalid or expired."
	msgNotYours     = "This token may not act for or read another user."
	msgNeedAdmin    = "This request needs a token with the allot:admin scope."
	msgNeedOperator = "This request needs a token with the allot:operator scope."
	msgAuthFlood    = "Too many requests with invalid tokens from this address; retry after the time in the Retry-After header."
)

// callerKey is the context key of the verified Identity.
type callerKey struct{}

// caller returns the verified identity of the request, and false when
// authentication is off (every caller may do everything).
func caller(ctx context.Context) (auth.Identity, bool) {
	id, ok := ctx.Value(callerKey{}).(auth.Identity)
	return id, ok
}

// DefaultBadAuthRate and DefaultBadAuthBurst bound the requests with a
// missing or invalid token per client address (clientAddr: the peer, or
// the forwarded client behind a trusted proxy).
const (
	DefaultBadAuthRate  = 5
	DefaultBadAuthBurst = 50
)

// badAuth limits, per client address, the requests that fail
// authentication. Only a failure is charged and only a failure is refused:
// a token that verifies is served whatever else came from its address (a
// proxy or a NAT puts many clients behind one), so every token is
// verified, and an address over its budget gets 429 instead of 401 for its
// bad ones, telling it to back off.
type badAuth struct {
	l    *userLimiter
	seed maphash.Seed
}

func newBadAuth(rate float64) *badAuth {
	return &badAuth{l: newUserLimiter(rate, max(DefaultBadAuthBurst, int(10*rate))), seed: maphash.MakeSeed()}
}

// key hashes a client address into the limiter's key space.
func (b *badAuth) key(addr string) int64 {
	return int64(maphash.String(b.seed, addr))
}

// guard wraps h in p. With authentication off, every request passes and
// carries no identity.
func (s *Service) guard(p policy, h http.HandlerFunc) http.HandlerFunc {
	if s.opts.Auth == nil || p == public {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := s.authenticate(r, p)
		if err != nil {
			if s.badAuth != nil {
				key := s.badAuth.key(clientAddr(r, s.opts.TrustedProxies))
				if ok, wait := s.badAuth.l.allow(key, time.Now()); !ok {
					s.metrics.authFailures.WithLabelValues("flood").Inc()
					retryAfter(w, wait)
					writeError(w, http.StatusTooManyRequests, msgAuthFlood)
					return
				}
			}
			msg, reason := msgBadToken, "invalid"
			if errors.Is(err, auth.ErrNoToken) {
				msg, reason = msgNoToken, "missing"
			}
			s.metrics.authFailures.WithLabelValues(reason).Inc()
			if s.log.Enabled(r.Context(), slog.LevelDebug) {
				s.log.DebugContext(r.Context(), "authentication failed", slog.String("path", r.URL.Path), slog.Any("err", err))
			}
			w.Header()["Www-Authenticate"] = []string{"Bearer"} // exactly the value api/openapi.yaml names
			writeError(w, http.StatusUnauthorized, msg)
			return
		}
		switch p {
		case admin:
			if !id.Admin {
				writeError(w, http.StatusForbidden, msgNeedAdmin)
				return
			}
		case operator:
			if !id.Operator {
				writeError(w, http.StatusForbidden, msgNeedOperator)
				return
			}
		case self:
			// A malformed {user} is left to the handler: a 400 says more.
			if user, err := parseID(r.PathValue("user"), "user"); err == nil && !id.ActsFor(user) {
				writeError(w, http.StatusForbidden, msgNotYours)
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, id)))
	}
}

// authenticate verifies the request's bearer token. The live feed also
// takes it as ?access_token= (RFC 6750 section 2.3), because a browser's
// EventSource cannot send headers.
func (s *Service) authenticate(r *http.Request, p policy) (auth.Identity, error) {
	id, err := s.opts.Auth.Authenticate(r)
	if errors.Is(err, auth.ErrNoToken) && p == operator {
		if tok := r.URL.Query().Get("access_token"); tok != "" {
			return s.opts.Auth.Verify(r.Context(), tok)
		}
	}
	return id, err
}
