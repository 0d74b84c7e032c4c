package ingest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/wire"
)

// Test identity settings of the authenticated harness.
const (
	testKey      = "allot-test-hs256-key-0123456789abcdef"
	testIssuer   = "https://issuer.allot.test"
	testAudience = "allot-api"
)

// newAuthHarness is newHarness with HS256 bearer tokens required (issuer
// and audience set), unless set gives a Verifier already.
func newAuthHarness(t *testing.T, set setup) *harness {
	t.Helper()
	return newHarness(t, func(c *Config, d *Deps) {
		if set != nil {
			set(c, d)
		}
		if d.Verifier == nil {
			v, err := auth.New(auth.Config{HS256Key: []byte(testKey), Issuer: testIssuer, Audience: testAudience})
			if err != nil {
				t.Fatalf("auth.New: %v", err)
			}
			t.Cleanup(v.Close)
			d.Verifier = v
		}
	})
}

// tokenFor signs an HS256 token with the test key for sub and scopes, valid
// for an hour, with the harness's issuer and audience.
func tokenFor(t *testing.T, sub string, scopes ...string) string {
	t.Helper()
	return signHS(t, testKey, jwt.MapClaims{
		"sub": sub, "scope": strings.Join(scopes, " "), "iss": testIssuer, "aud": testAudience,
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
	})
}

func signHS(t *testing.T, key string, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func bearer(tok string) map[string]string {
	if tok == "" {
		return nil
	}
	return map[string]string{"Authorization": "Bearer " + tok}
}

// streamMsgs is the number of messages in the request stream.
func (h *harness) streamMsgs() uint64 {
	h.t.Helper()
	st, err := h.js.Stream(context.Background(), wire.RequestStream)
	if err != nil {
		h.t.Fatalf("stream %s: %v", wire.RequestStream, err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		h.t.Fatalf("stream info: %v", err)
	}
	return info.State.Msgs
}

// status sends rq and returns its status and body; for the live feed it
// reads only the headers (the stream does not end by itself).
func (h *harness) status(rq req) (*http.Response, []byte) {
	h.t.Helper()
	if path, _, _ := strings.Cut(rq.path, "?"); !strings.HasSuffix(path, "/live") {
		return h.do(rq)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, rq.method, h.srv.URL+rq.path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	for k, v := range rq.header {
		r.Header.Set(k, v)
	}
	resp, err := h.cl.Do(r)
	if err != nil {
		h.t.Fatalf("%s %s: %v", rq.method, rq.path, err)
	}
	defer resp.Body.Close()
	var body []byte
	if resp.StatusCode != http.StatusOK {
		body = make([]byte, 4096)
		n, _ := resp.Body.Read(body)
		body = body[:n]
	}
	return resp, body
}

// TestAuthEveryRoute drives every route with every kind of token: the
// exact status, one sentence, WWW-Authenticate on 401, and nothing stored
// in the request stream unless the write was allowed.
func TestAuthEveryRoute(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, func(c *Config, d *Deps) { c.BadAuthRate = -1 })
	ctx := context.Background()
	// An open activity with user 5 on it, so the reads answer 200.
	if _, err := h.db.ExecContext(ctx, "INSERT INTO activity (id, capacity, confirmed_count) VALUES (1, 2, 1)"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.ExecContext(ctx, "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 5, 'CONFIRMED', 1)"); err != nil {
		t.Fatal(err)
	}
	// A pending request of user 5.
	resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/1/claims/5", header: bearer(tokenFor(t, "5"))})
	pending := accepted(t, "user 5's claim", resp, body)

	now := time.Now()
	std := func(m jwt.MapClaims) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "5", "iss": testIssuer, "aud": testAudience, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
		for k, v := range m {
			c[k] = v
		}
		return c
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, std(nil)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"no token":        "",
		"expired":         signHS(t, testKey, std(jwt.MapClaims{"exp": now.Add(-2 * time.Minute).Unix()})),
		"wrong signature": signHS(t, "another-key-of-at-least-32-bytes-0123", std(nil)),
		"alg none":        none,
		"wrong issuer":    signHS(t, testKey, std(jwt.MapClaims{"iss": "https://evil.test"})),
		"wrong audience":  signHS(t, testKey, std(jwt.MapClaims{"aud": "someone-else"})),
		"no exp":          signHS(t, testKey, jwt.MapClaims{"sub": "5", "iss": testIssuer, "aud": testAudience}),
		"garbage":         "not.a.jwt",
	}
	user5, user6 := tokenFor(t, "5"), tokenFor(t, "6")
	admin, op := tokenFor(t, "99", auth.ScopeAdmin), tokenFor(t, "ops", auth.ScopeOperator)

	type route struct {
		method, path, body string
		right              string // the token that is allowed
		want               int    // its status
		other              int    // status for user 6 (another user's sub)
		noScope            int    // status for user 5 without a scope
		write              bool   // an allowed call stores one message
	}
	routes := []route{
		{method: http.MethodPut, path: "/v1/activities/2", body: `{"capacity": 1}`, right: admin, want: 202, other: 403, noScope: 403, write: true},
		{method: http.MethodPost, path: "/v1/activities/1/signups/5", right: user5, want: 202, other: 403, noScope: 202, write: true},
		{method: http.MethodDelete, path: "/v1/activities/1/signups/5", right: user5, want: 202, other: 403, noScope: 202, write: true},
		{method: http.MethodPost, path: "/v1/activities/1/claims/5", right: user5, want: 202, other: 403, noScope: 202, write: true},
		{method: http.MethodPost, path: "/v1/activities/1/signups/5/confirm", right: user5, want: 202, other: 403, noScope: 202, write: true},
		{method: http.MethodGet, path: "/v1/activities/1", right: user5, want: 200, other: 200, noScope: 200},
		{method: http.MethodGet, path: "/v1/activities/1/signups/5", right: user5, want: 200, other: 403, noScope: 200},
		{method: http.MethodGet, path: "/v1/requests/" + pending, right: user5, want: 200, other: 404, noScope: 200},
		{method: http.MethodGet, path: "/v1/activities/1/live", right: op, want: 200, other: 403, noScope: 403},
		{method: http.MethodGet, path: "/metrics", right: op, want: 200, other: 403, noScope: 403},
	}
	check := func(t *testing.T, rt route, tok string, want int, stores bool) {
		t.Helper()
		before := h.streamMsgs()
		resp, body := h.status(req{method: rt.method, path: rt.path, body: rt.body, header: bearer(tok)})
		wantStatus(t, rt.method+" "+rt.path, resp, body, want)
		if want >= 400 {
			errorSentence(t, rt.method+" "+rt.path, resp, body)
		}
		if want == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("%s %s: WWW-Authenticate = %q, want Bearer", rt.method, rt.path, resp.Header.Get("WWW-Authenticate"))
		}
		wantMsgs := before
		if stores {
			wantMsgs++
		}
		if got := h.streamMsgs(); got != wantMsgs {
			t.Errorf("%s %s: the request stream holds %d messages, want %d", rt.method, rt.path, got, wantMsgs)
		}
	}
	for _, rt := range routes {
		t.Run(rt.method+" "+rt.path, func(t *testing.T) {
			for name, tok := range bad {
				t.Run(name, func(t *testing.T) { check(t, rt, tok, http.StatusUnauthorized, false) })
			}
			t.Run("another user's sub", func(t *testing.T) { check(t, rt, user6, rt.other, rt.write && rt.other < 300) })
			t.Run("missing scope", func(t *testing.T) { check(t, rt, user5, rt.noScope, rt.write && rt.noScope < 300) })
			t.Run("right token", func(t *testing.T) { check(t, rt, rt.right, rt.want, rt.write) })
			if rt.right != admin {
				// allot:admin acts for and reads any user, but is no operator.
				want := rt.want
				if rt.right == op {
					want = http.StatusForbidden
				}
				t.Run("admin", func(t *testing.T) { check(t, rt, admin, want, rt.write && want < 300) })
			}
		})
	}
	// Health and readiness need no token.
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, body := h.do(req{method: http.MethodGet, path: p})
		wantStatus(t, p+" without a token", resp, body, http.StatusOK)
	}
	// The operator page's static shell holds no data and needs no token.
	resp, body = h.do(req{method: http.MethodGet, path: "/", header: map[string]string{"Accept": "text/html"}})
	wantStatus(t, "the operator page", resp, body, http.StatusOK)
	// The live feed takes its token as ?access_token= (EventSource sends no headers).
	resp, body = h.status(req{method: http.MethodGet, path: "/v1/activities/1/live?access_token=" + op})
	wantStatus(t, "live feed with ?access_token=", resp, body, http.StatusOK)
	resp, body = h.status(req{method: http.MethodGet, path: "/v1/activities/1/live?access_token=" + user5})
	wantStatus(t, "live feed with a user's ?access_token=", resp, body, http.StatusForbidden)
	// ?access_token= is for the feed only.
	resp, body = h.do(req{method: http.MethodPost, path: "/v1/activities/1/claims/5?access_token=" + user5})
	wantStatus(t, "a write with ?access_token=", resp, body, http.StatusUnauthorized)
}

// TestAuthPollOwner: another user's request id reads exactly as an id never
// issued (404, same sentence), pending or done; its owner and an admin read it.
func TestAuthPollOwner(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, nil)
	user5, user6, admin := tokenFor(t, "5"), tokenFor(t, "6"), tokenFor(t, "1", auth.ScopeAdmin)
	resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/4/signups/5", header: bearer(user5)})
	id := accepted(t, "join", resp, body)
	unknownID, err := access.NewIDIssuer("").New(5, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	unknownID[12] ^= 0xff // a well-formed id ingest never issued
	resp, body = h.do(req{method: http.MethodGet, path: "/v1/requests/" + unknownID.String(), header: bearer(user6)})
	wantStatus(t, "an id never issued", resp, body, http.StatusNotFound)
	neverIssued := strings.ReplaceAll(errorSentence(t, "never issued", resp, body), unknownID.String(), "ID")

	poll := func(what, tok string, want int) []byte {
		t.Helper()
		resp, body := h.do(req{method: http.MethodGet, path: "/v1/requests/" + id, header: bearer(tok)})
		wantStatus(t, what, resp, body, want)
		if want == http.StatusNotFound {
			if got := strings.ReplaceAll(errorSentence(t, what, resp, body), id, "ID"); got != neverIssued {
				t.Fatalf("%s: %q, want the never-issued sentence %q", what, got, neverIssued)
			}
		}
		return body
	}
	poll("pending, another user", user6, http.StatusNotFound)
	if got := decode[wire.Result](t, "pending, owner", poll("pending, owner", user5, http.StatusOK)); got.State != wire.StatePending {
		t.Fatalf("owner reads %+v, want pending", got)
	}
	poll("pending, admin", admin, http.StatusOK)
	poll("pending, a service token that is no user", tokenFor(t, "ops", auth.ScopeOperator), http.StatusNotFound)

	h.insertResult(wire.Result{RequestID: id, State: wire.StateDone, Op: wire.OpJoin, ActivityID: 4, UserID: 5,
		Outcome: "CONFIRMED", Status: ptr(wire.StatusConfirmed), AppliedAt: time.Now().UTC()})
	poll("done, another user", user6, http.StatusNotFound)
	if got := decode[wire.Result](t, "done, owner", poll("done, owner", user5, http.StatusOK)); got.Outcome != "CONFIRMED" {
		t.Fatalf("owner reads %+v, want CONFIRMED", got)
	}
	poll("done, admin", admin, http.StatusOK)
}

// TestAuthRateLimitBySubject: the per-user limit counts the token's
// subject, so one subject changing the path's user id is limited, and two
// subjects do not limit each other.
func TestAuthRateLimitBySubject(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, func(c *Config, d *Deps) { c.UserRate = 0.01; d.Test.UserBurst = 3 })
	bot := tokenFor(t, "100", auth.ScopeAdmin) // an admin can name any user in the path
	codes := map[int]int{}
	for u := 1; u <= 6; u++ {
		resp, _ := h.do(req{method: http.MethodPost, path: "/v1/activities/7/claims/" + jsonInt(int64(u)), header: bearer(bot)})
		codes[resp.StatusCode]++
	}
	if codes[http.StatusAccepted] != 3 || codes[http.StatusTooManyRequests] != 3 {
		t.Fatalf("one subject over six path users: %v, want 3×202 then 3×429", codes)
	}
	// The victims, on their own paths, still have their whole budget.
	for u := 1; u <= 2; u++ {
		tok := tokenFor(t, jsonInt(int64(u)))
		for range 3 {
			resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/7/claims/" + jsonInt(int64(u)), header: bearer(tok)})
			accepted(t, "user's own claim", resp, body)
		}
	}
}

// TestAuthBadTokenFlood: requests failing authentication are limited per
// client address before their tokens are verified.
func TestAuthBadTokenFlood(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, func(c *Config, d *Deps) { c.BadAuthRate = 0.01 })
	codes := map[int]int{}
	for range access.DefaultBadAuthBurst + 5 {
		resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/7/claims/1", header: bearer("bad.token.here")})
		codes[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After: %s", body)
		}
	}
	if codes[http.StatusUnauthorized] != access.DefaultBadAuthBurst || codes[http.StatusTooManyRequests] != 5 {
		t.Fatalf("bad tokens: %v, want %d×401 then 5×429", codes, access.DefaultBadAuthBurst)
	}
	if n := h.streamMsgs(); n != 0 {
		t.Fatalf("the request stream holds %d messages, want 0", n)
	}
}

// TestAuthIdempotencyKeyScopedToCaller: the same key used by two callers
// binds two requests; by one caller, one.
func TestAuthIdempotencyKeyScopedToCaller(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, nil)
	a, b := tokenFor(t, "100", auth.ScopeAdmin), tokenFor(t, "200", auth.ScopeAdmin)
	put := func(tok string) string {
		hd := bearer(tok)
		hd["Idempotency-Key"] = "same-key"
		resp, body := h.do(req{method: http.MethodPut, path: "/v1/activities/8", body: `{"capacity": 1}`, header: hd})
		return accepted(t, "open", resp, body)
	}
	a1, a2, b1 := put(a), put(a), put(b)
	if a1 != a2 {
		t.Fatalf("one caller's key gave %s then %s, want the same id", a1, a2)
	}
	if a1 == b1 {
		t.Fatalf("two callers' keys gave the same id %s, want two requests", a1)
	}
	if n := h.streamMsgs(); n != 2 {
		t.Fatalf("the request stream holds %d messages, want 2", n)
	}
}

// jwksServer serves a JWKS that a test can replace.
type jwksServer struct {
	mu   sync.Mutex
	body []byte
	srv  *httptest.Server
}

func (j *jwksServer) set(t *testing.T, keys map[string]crypto.Signer) {
	t.Helper()
	var set jwkset.JWKSMarshal
	for kid, k := range keys {
		jwk, err := jwkset.NewJWKFromKey(k.Public(), jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: kid}})
		if err != nil {
			t.Fatalf("jwk %s: %v", kid, err)
		}
		set.Keys = append(set.Keys, jwk.Marshal())
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	j.mu.Lock()
	j.body = b
	j.mu.Unlock()
}

func signWith(t *testing.T, m jwt.SigningMethod, kid string, k crypto.Signer, sub string) string {
	t.Helper()
	tk := jwt.NewWithClaims(m, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()})
	tk.Header["kid"] = kid
	s, err := tk.SignedString(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestAuthJWKSRotation: tokens signed with RS256, ES256 and EdDSA keys from
// a JWKS are accepted; a key rotated in mid-test is picked up without a
// restart, and the key rotated out is refused from then on.
func TestAuthJWKSRotation(t *testing.T) {
	t.Parallel()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	j := &jwksServer{}
	j.set(t, map[string]crypto.Signer{"rsa-1": rsaKey})
	j.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		j.mu.Lock()
		defer j.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write(j.body) //nolint:errcheck
	}))
	t.Cleanup(j.srv.Close)
	v, err := auth.New(auth.Config{JWKSURL: j.srv.URL, JWKSUnknownKID: time.Millisecond, JWKSRefresh: time.Hour})
	if err != nil {
		t.Fatalf("auth.New: %v", err)
	}
	t.Cleanup(v.Close)
	h := newAuthHarness(t, func(c *Config, d *Deps) { d.Verifier = v; c.BadAuthRate = -1 })
	claim := func(what, tok string, want int) {
		t.Helper()
		resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/3/claims/5", header: bearer(tok)})
		wantStatus(t, what, resp, body, want)
	}
	rs := signWith(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, "5")
	claim("RS256 from the JWKS", rs, http.StatusAccepted)
	// HS256 with the RSA public key as its secret: the classic confusion.
	pub, _ := json.Marshal(rsaKey.Public())
	claim("HS256 signed with the public key", signHS(t, string(pub), jwt.MapClaims{"sub": "5", "exp": time.Now().Add(time.Hour).Unix()}), http.StatusUnauthorized)
	// RS256 token claiming the EC key's id once that is served: wrong key type.
	j.set(t, map[string]crypto.Signer{"ec-2": ecKey, "ed-3": edKey})
	claim("ES256 after the rotation", signWith(t, jwt.SigningMethodES256, "ec-2", ecKey, "5"), http.StatusAccepted)
	claim("EdDSA after the rotation", signWith(t, jwt.SigningMethodEdDSA, "ed-3", edKey, "5"), http.StatusAccepted)
	claim("RS256 with a rotated-out key", rs, http.StatusUnauthorized)
	claim("RS256 naming an EC key", signWith(t, jwt.SigningMethodRS256, "ec-2", rsaKey, "5"), http.StatusUnauthorized)
}

// TestIngestWritesWithoutMySQL: ingest's writes never touch MySQL, so with
// the database unreachable it keeps answering 202, while /readyz (NATS and
// MySQL, as api/openapi.yaml says) and the reads that need MySQL answer 503
// with a sentence; /healthz stays 200.
func TestIngestWritesWithoutMySQL(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/nowhere?timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h := newHarnessWith(t, nil, db, func(c *Config, d *Deps) { d.Test.QueryTimeout = 2 * time.Second })
	for u := 1; u <= 3; u++ {
		resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/1/signups/" + jsonInt(int64(u))})
		accepted(t, "join without MySQL", resp, body)
	}
	if n := h.streamMsgs(); n != 3 {
		t.Fatalf("the request stream holds %d messages, want 3", n)
	}
	resp, body := h.do(req{method: http.MethodGet, path: "/readyz"})
	wantStatus(t, "/readyz without MySQL", resp, body, http.StatusServiceUnavailable)
	errorSentence(t, "/readyz without MySQL", resp, body)
	resp, body = h.do(req{method: http.MethodGet, path: "/healthz"})
	wantStatus(t, "/healthz without MySQL", resp, body, http.StatusOK)
	resp, body = h.do(req{method: http.MethodGet, path: "/v1/activities/1"})
	wantStatus(t, "activity state without MySQL", resp, body, http.StatusServiceUnavailable)
	errorSentence(t, "activity state without MySQL", resp, body)
}
