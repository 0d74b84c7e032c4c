// Package access decides who may call what and how often: bearer-token
// authentication and the policy of each route (guard.go), the write, open,
// per-user, per-reader and bad-token rate limits (limits.go,
// userlimit.go), the client address behind trusted proxies (clientaddr.go),
// the request ids ingest mints and checks (requestid.go), and the
// authentication settings (authenv.go). Access is the component.
package access

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"net/http"
	"time"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/ingest/reply"
)

// Who may call what (docs/operations.md, "Authentication"). Each
// route's handler is wrapped in one Policy (Guard), so that the policy does
// not depend on how the routes are matched.
type Policy int

const (
	// Public: no token needed (/healthz, /readyz, the page's static shell).
	Public Policy = iota
	// AnyCaller: any valid token (activity state, polls: the poll itself
	// checks the request's owner).
	AnyCaller
	// Self: the path's {user} must be the token's sub, or allot:admin.
	Self
	// Admin: allot:admin.
	Admin
	// Operator: allot:operator (the live feed, /metrics).
	Operator
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

// Caller returns the verified identity of the request, and false when
// authentication is off (every caller may do everything).
func Caller(ctx context.Context) (auth.Identity, bool) {
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

// Guard wraps h in p. With authentication off, every request passes and
// carries no identity.
func (a *Access) Guard(p Policy, h http.HandlerFunc) http.HandlerFunc {
	if a.auth == nil || p == Public {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := a.authenticate(r, p)
		if err != nil {
			if a.badAuth != nil {
				key := a.badAuth.key(clientAddr(r, a.trusted))
				if ok, wait := a.badAuth.l.allow(key, time.Now()); !ok {
					a.m.AuthFailures.WithLabelValues("flood").Inc()
					reply.RetryAfter(w, wait)
					reply.Error(w, http.StatusTooManyRequests, msgAuthFlood)
					return
				}
			}
			msg, reason := msgBadToken, "invalid"
			if errors.Is(err, auth.ErrNoToken) {
				msg, reason = msgNoToken, "missing"
			}
			a.m.AuthFailures.WithLabelValues(reason).Inc()
			if a.log.Enabled(r.Context(), slog.LevelDebug) {
				a.log.DebugContext(r.Context(), "authentication failed", slog.String("path", r.URL.Path), slog.Any("err", err))
			}
			w.Header()["Www-Authenticate"] = []string{"Bearer"} // exactly the value api/openapi.yaml names
			reply.Error(w, http.StatusUnauthorized, msg)
			return
		}
		switch p {
		case Admin:
			if !id.Admin {
				reply.Error(w, http.StatusForbidden, msgNeedAdmin)
				return
			}
		case Operator:
			if !id.Operator {
				reply.Error(w, http.StatusForbidden, msgNeedOperator)
				return
			}
		case Self:
			// A malformed {user} is left to the handler: a 400 says more.
			if user, err := reply.ParseID(r.PathValue("user"), "user"); err == nil && !id.ActsFor(user) {
				reply.Error(w, http.StatusForbidden, msgNotYours)
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, id)))
	}
}

// authenticate verifies the request's bearer token. The live feed also
// takes it as ?access_token= (RFC 6750 section 2.3), because a browser's
// EventSource cannot send headers.
func (a *Access) authenticate(r *http.Request, p Policy) (auth.Identity, error) {
	id, err := a.auth.Authenticate(r)
	if errors.Is(err, auth.ErrNoToken) && p == Operator {
		if tok := r.URL.Query().Get("access_token"); tok != "" {
			return a.auth.Verify(r.Context(), tok)
		}
	}
	return id, err
}
