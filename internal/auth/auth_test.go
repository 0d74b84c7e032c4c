package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"

	"github.com/allot-dev/allot/internal/testenv"
)

const key = "unit-test-hs256-key-0123456789abcdef"

func sign(t *testing.T, m jwt.SigningMethod, k any, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, c).SignedString(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestVerify(t *testing.T) {
	t.Parallel()
	v, err := New(Config{HS256Key: []byte(key), Issuer: "iss", Audience: "aud"})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	now := time.Now()
	base := func(m jwt.MapClaims) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "42", "iss": "iss", "aud": "aud", "exp": now.Add(time.Minute).Unix()}
		for k, x := range m {
			if x == nil {
				delete(c, k)
			} else {
				c[k] = x
			}
		}
		return c
	}
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, base(nil))
	tests := []struct {
		name string
		tok  string
		want Identity // zero: invalid
	}{
		{"valid", sign(t, jwt.SigningMethodHS256, []byte(key), base(nil)), Identity{Subject: "42", User: 42}},
		{"admin and operator", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"scope": "x allot:admin allot:operator"})),
			Identity{Subject: "42", User: 42, Admin: true, Operator: true}},
		{"service token with a scope", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"sub": "ops", "scope": ScopeOperator})),
			Identity{Subject: "ops", Operator: true}},
		{"expired within the leeway", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"exp": now.Add(-10 * time.Second).Unix()})),
			Identity{Subject: "42", User: 42}},
		{"expired beyond the leeway", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"exp": now.Add(-time.Minute).Unix()})), Identity{}},
		{"no exp", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"exp": nil})), Identity{}},
		{"alg none", none, Identity{}},
		{"HS384", sign(t, jwt.SigningMethodHS384, []byte(key), base(nil)), Identity{}},
		{"wrong key", sign(t, jwt.SigningMethodHS256, []byte(key+"x"), base(nil)), Identity{}},
		{"wrong issuer", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"iss": "other"})), Identity{}},
		{"wrong audience", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"aud": "other"})), Identity{}},
		{"no sub", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"sub": nil})), Identity{}},
		{"sub not a user, no scope", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"sub": "bob"})), Identity{}},
		{"sub zero", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"sub": "0"})), Identity{}},
		{"garbage", "a.b.c", Identity{}},
		{"max user id", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"sub": "9223372036854775807"})),
			Identity{Subject: "9223372036854775807", User: 9223372036854775807}},
		{"service name with a scope", sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"sub": "f47ac10b-58cc", "scope": ScopeAdmin})),
			Identity{Subject: "f47ac10b-58cc", Admin: true}},
	}
	// A number not in a user id's one spelling is refused, scoped or not.
	for _, sub := range []string{"+7", "007", " 7", "7 ", "7.0", "7e0", "0", "00", "-7", "0x7", "1_0", "9223372036854775808", "99999999999999999999"} {
		for _, scope := range []string{"", ScopeAdmin} {
			tests = append(tests, struct {
				name string
				tok  string
				want Identity
			}{"sub " + sub + " " + scope, sign(t, jwt.SigningMethodHS256, []byte(key), base(jwt.MapClaims{"sub": sub, "scope": scope})), Identity{}})
		}
	}
	for _, tt := range tests {
		got, err := v.Verify(context.Background(), tt.tok)
		if tt.want == (Identity{}) {
			if err == nil || !errors.Is(err, ErrInvalidToken) {
				t.Errorf("%s: Verify = %+v, %v; want ErrInvalidToken", tt.name, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: Verify = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

// TestJWKSOnlyRefusesHS256: with only a JWKS configured, an HS256 token is
// refused whatever it is signed with (no key confusion).
func TestJWKSOnlyRefusesHS256(t *testing.T) {
	t.Parallel()
	v, err := New(Config{JWKSURL: "http://127.0.0.1:1/jwks", JWKSRefresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	tok := sign(t, jwt.SigningMethodHS256, []byte(key), jwt.MapClaims{"sub": "1", "exp": time.Now().Add(time.Minute).Unix()})
	if _, err := v.Verify(context.Background(), tok); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("HS256 against a JWKS-only verifier: %v, want ErrInvalidToken", err)
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	for _, c := range []Config{{}, {HS256Key: []byte("short")}} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", c)
		}
	}
}

func TestMintAndBearer(t *testing.T) {
	t.Parallel()
	tok, err := MintHS256([]byte(key), Claims{Subject: "7", Scopes: []string{ScopeAdmin}, Issuer: "i", Audience: "a"})
	if err != nil {
		t.Fatal(err)
	}
	v, err := New(Config{HS256Key: []byte(key), Issuer: "i", Audience: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	id, err := v.Verify(context.Background(), tok)
	if err != nil || id.User != 7 || !id.Admin || id.Operator {
		t.Fatalf("minted token verifies as %+v, %v; want user 7, admin", id, err)
	}
	if _, err := MintHS256([]byte("short"), Claims{Subject: "1"}); err == nil {
		t.Fatal("MintHS256 with a short key succeeded")
	}
	for h, want := range map[string]string{"Bearer abc": "abc", "bearer  abc ": "abc", "Basic abc": "", "Bearer": "", "": ""} {
		got, ok := Bearer(h)
		if got != want || ok != (want != "") {
			t.Errorf("Bearer(%q) = %q, %v; want %q", h, got, ok, want)
		}
	}
	if !strings.HasPrefix(tok, "eyJ") {
		t.Fatalf("token %q is not a JWS", tok)
	}
}

// TestJWKSLateStart: a JWKS endpoint that fails at start does not stop the
// verifier; once it serves keys, a token of one of them is accepted
// without a restart.
func TestJWKSLateStart(t *testing.T) {
	t.Parallel()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwk, err := jwkset.NewJWKFromKey(priv.Public(), jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: "k1"}})
	if err != nil {
		t.Fatal(err)
	}
	set, err := json.Marshal(jwkset.JWKSMarshal{Keys: []jwkset.JWKMarshal{jwk.Marshal()}})
	if err != nil {
		t.Fatal(err)
	}
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !up.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write(set) //nolint:errcheck
	}))
	defer srv.Close()
	v, err := New(Config{JWKSURL: srv.URL, JWKSUnknownKID: time.Millisecond, JWKSRefresh: time.Hour})
	if err != nil {
		t.Fatalf("New with the JWKS down: %v", err)
	}
	defer v.Close()
	tk := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"sub": "9", "exp": time.Now().Add(time.Minute).Unix()})
	tk.Header["kid"] = "k1"
	tok, err := tk.SignedString(priv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(context.Background(), tok); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("with the JWKS down: %v, want ErrInvalidToken", err)
	}
	up.Store(true)
	// The unknown key id fetches the JWKS again, at most once a millisecond.
	testenv.WaitFor(t, 5*time.Second, "the token verifies once the JWKS is up", func() bool {
		id, err := v.Verify(context.Background(), tok)
		return err == nil && id.User == 9
	})
}
