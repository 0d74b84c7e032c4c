// Package auth owns allot's caller identity: it verifies bearer JWTs (an
// HS256 shared secret and/or the keys of a JWKS endpoint: RS256, ES256,
// EdDSA) and turns a valid token into an Identity: the subject (the
// caller's user id) and its scopes. It decides nothing about routes; the
// HTTP edge (package ingest) maps identities to answers.
package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// Scopes a token may carry in its space-separated scope claim.
const (
	// ScopeAdmin opens and resizes activities and acts for and reads any user.
	ScopeAdmin = "allot:admin"
	// ScopeOperator sees the operator page's live feed and /metrics.
	ScopeOperator = "allot:operator"
)

// MinHS256Key is the shortest accepted HS256 secret: 256 bits, the size of
// the hash (RFC 7518 section 3.2).
const MinHS256Key = 32

// DefaultLeeway is the clock skew allowed on exp, nbf and iat.
const DefaultLeeway = 30 * time.Second

// DefaultJWKSRefresh is how often the JWKS is fetched again. A token signed
// with a key id the cache does not know fetches it at once (at most once
// every DefaultJWKSUnknownKID), so a rotation needs no restart and no wait.
const (
	DefaultJWKSRefresh    = 5 * time.Minute
	DefaultJWKSUnknownKID = 10 * time.Second
)

// Sentinel errors of Verify; both mean 401.
var (
	// ErrNoToken means the request carries no bearer token.
	ErrNoToken = errors.New("no bearer token")
	// ErrInvalidToken means the token is not valid: signature, algorithm,
	// expiry, issuer, audience or subject.
	ErrInvalidToken = errors.New("invalid bearer token")
)

// Config says which tokens are valid. At least one of HS256Key and JWKSURL
// must be set.
type Config struct {
	// HS256Key is the shared secret of HS256 tokens, at least MinHS256Key
	// bytes; empty: HS256 tokens are refused.
	HS256Key []byte
	// JWKSURL is the endpoint whose keys sign RS256, ES256 and EdDSA
	// tokens; empty: those are refused.
	JWKSURL string
	// Issuer and Audience, when set, must match iss and (one of) aud.
	Issuer, Audience string
	// Leeway is the clock skew allowed on exp; default DefaultLeeway.
	Leeway time.Duration
	// JWKSRefresh is the JWKS refresh interval; default DefaultJWKSRefresh.
	JWKSRefresh time.Duration
	// JWKSUnknownKID bounds how often a token with an unknown key id
	// fetches the JWKS; default DefaultJWKSUnknownKID.
	JWKSUnknownKID time.Duration
	// HTTPClient fetches the JWKS; default a client with a 10s timeout.
	HTTPClient *http.Client
	// Log receives failed JWKS fetches (the last good keys stay in use);
	// nil discards them.
	Log *slog.Logger
}

// Identity is a verified caller.
type Identity struct {
	// Subject is the token's sub, the caller's user id in decimal.
	Subject string
	// User is Subject parsed; 0 when sub is not a user id (a service
	// token with a scope).
	User     int64
	Admin    bool
	Operator bool
}

// ActsFor reports whether the caller may act for or read user.
func (id Identity) ActsFor(user int64) bool {
	return id.Admin || (id.User != 0 && id.User == user)
}

// Verifier checks bearer tokens. It is safe for concurrent use.
type Verifier struct {
	hs     []byte
	jwks   keyfunc.Keyfunc // nil without JWKSURL
	parser *jwt.Parser
	stop   context.CancelFunc
}

// jwksAlgs are the asymmetric algorithms a JWKS key may sign with.
var jwksAlgs = []string{"RS256", "ES256", "EdDSA"}

// New builds a Verifier. With a JWKS URL it starts a goroutine that
// refreshes the keys until Close; the first fetch may fail (the endpoint
// may come up later): tokens are refused until a fetch succeeds.
func New(cfg Config) (*Verifier, error) {
	if len(cfg.HS256Key) == 0 && cfg.JWKSURL == "" {
		return nil, errors.New("auth: neither an HS256 key nor a JWKS URL is configured")
	}
	if len(cfg.HS256Key) > 0 && len(cfg.HS256Key) < MinHS256Key {
		return nil, fmt.Errorf("auth: the HS256 key must be at least %d bytes, got %d", MinHS256Key, len(cfg.HS256Key))
	}
	if cfg.Leeway <= 0 {
		cfg.Leeway = DefaultLeeway
	}
	v := &Verifier{hs: cfg.HS256Key, stop: func() {}}
	var algs []string
	if len(v.hs) > 0 {
		algs = append(algs, "HS256")
	}
	if cfg.JWKSURL != "" {
		algs = append(algs, jwksAlgs...)
		client := cfg.HTTPClient
		if client == nil {
			client = &http.Client{Timeout: 10 * time.Second}
		}
		refresh := cfg.JWKSRefresh
		if refresh <= 0 {
			refresh = DefaultJWKSRefresh
		}
		unknown := cfg.JWKSUnknownKID
		if unknown <= 0 {
			unknown = DefaultJWKSUnknownKID
		}
		ctx, cancel := context.WithCancel(context.Background())
		kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL}, keyfunc.Override{
			Client:            client,
			HTTPTimeout:       10 * time.Second,
			RefreshInterval:   refresh,
			RefreshUnknownKID: rate.NewLimiter(rate.Every(unknown), 1),
			RateLimitWaitMax:  time.Second,
			// A failed fetch keeps the last good keys; it is logged here
			// rather than by the library into the global logger.
			RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
				return func(ctx context.Context, err error) {
					if cfg.Log != nil {
						cfg.Log.WarnContext(ctx, "JWKS fetch failed; tokens of keys not yet fetched are refused",
							slog.String("jwks_url", u), slog.Any("err", err))
					}
				}
			},
		})
		if err != nil {
			cancel()
			return nil, fmt.Errorf("auth: JWKS %s: %w", cfg.JWKSURL, err)
		}
		v.jwks, v.stop = kf, cancel
	}
	opts := []jwt.ParserOption{
		// The algorithm is pinned to the kind of key: HS256 only with the
		// shared secret, the asymmetric ones only with a JWKS key (keyFor
		// enforces the pairing), never none.
		jwt.WithValidMethods(algs),
		jwt.WithLeeway(cfg.Leeway),
		jwt.WithExpirationRequired(),
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// Close stops the JWKS refresh.
func (v *Verifier) Close() { v.stop() }

// claims are the registered claims plus scope.
type claims struct {
	jwt.RegisteredClaims
	Scope string `json:"scope,omitempty"`
}

// keyFor returns the verification key of t: the shared secret for HS256,
// a JWKS key for the others. golang-jwt checks that the key's type fits
// the method, so an RSA public key can never be used as an HMAC secret.
func (v *Verifier) keyFor(ctx context.Context) jwt.Keyfunc {
	return func(t *jwt.Token) (any, error) {
		if t.Method.Alg() == "HS256" {
			if len(v.hs) == 0 {
				return nil, errors.New("HS256 is not accepted")
			}
			return v.hs, nil
		}
		if v.jwks == nil {
			return nil, fmt.Errorf("%s is not accepted", t.Method.Alg())
		}
		return v.jwks.KeyfuncCtx(ctx)(t)
	}
}

// Verify checks raw (the token without "Bearer ") and returns its caller.
// Errors wrap ErrInvalidToken.
func (v *Verifier) Verify(ctx context.Context, raw string) (Identity, error) {
	var c claims
	if _, err := v.parser.ParseWithClaims(raw, &c, v.keyFor(ctx)); err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	if c.Subject == "" {
		return Identity{}, fmt.Errorf("%w: no sub", ErrInvalidToken)
	}
	id := Identity{Subject: c.Subject}
	for s := range strings.FieldsSeq(c.Scope) {
		switch s {
		case ScopeAdmin:
			id.Admin = true
		case ScopeOperator:
			id.Operator = true
		}
	}
	switch u, ok := UserID(c.Subject); {
	case ok:
		id.User = u
	case numeric(c.Subject):
		// "+7", "007", " 7", "7.0", "0": a number that is not a user id's
		// one spelling would be a second name of a user (its own
		// idempotency scope and rate budget), or of none; refused, scoped
		// or not.
		return Identity{}, fmt.Errorf("%w: sub %q is not a user id in canonical decimal form (1..%d)", ErrInvalidToken, c.Subject, int64(math.MaxInt64))
	case !id.Admin && !id.Operator:
		// Only a scoped service token may have a sub that is no user id.
		return Identity{}, fmt.Errorf("%w: sub %q is not a user id", ErrInvalidToken, c.Subject)
	}
	return id, nil
}

// UserID parses sub as a user id: the canonical decimal form of
// 1..2^63-1 only (no sign, no leading zero, no space), so that each user
// has exactly one subject.
func UserID(sub string) (int64, bool) {
	if sub == "" || len(sub) > 19 || sub[0] == '0' {
		return 0, false
	}
	for i := range len(sub) {
		if sub[i] < '0' || sub[i] > '9' {
			return 0, false
		}
	}
	u, err := strconv.ParseInt(sub, 10, 64)
	return u, err == nil && u > 0
}

// numeric reports whether sub reads as a number to a lenient parser (a
// sign, leading zeros, spaces, a fraction, an exponent, a base prefix or
// digit separators): a subject that could pass for a user id somewhere.
func numeric(sub string) bool {
	t := strings.TrimSpace(sub)
	if t == "" {
		return false
	}
	if _, err := strconv.ParseInt(t, 0, 64); err == nil {
		return true
	}
	if _, err := strconv.ParseInt(t, 10, 64); errors.Is(err, strconv.ErrRange) {
		return true
	}
	f, err := strconv.ParseFloat(t, 64)
	if errors.Is(err, strconv.ErrRange) {
		return true
	}
	return err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) // "inf" and "nan" stay names
}

// Authenticate verifies the bearer token of r. Without one it returns
// ErrNoToken.
func (v *Verifier) Authenticate(r *http.Request) (Identity, error) {
	raw, ok := Bearer(r.Header.Get("Authorization"))
	if !ok {
		return Identity{}, ErrNoToken
	}
	return v.Verify(r.Context(), raw)
}

// Bearer extracts the token of an Authorization header value.
func Bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}
