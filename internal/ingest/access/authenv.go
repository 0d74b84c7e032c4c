package access

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/allot-dev/allot/internal/auth"
)

// AuthConfig is ingest's authentication configuration (docs/operations.md).
type AuthConfig struct {
	Mode     string `envconfig:"AUTH" desc:"none switches authentication off explicitly; empty = on when a key is set"`
	HS256Key string `envconfig:"AUTH_HS256_KEY" desc:"shared secret (at least 32 bytes) of HS256 bearer tokens"`
	JWKSURL  string `envconfig:"AUTH_JWKS_URL" desc:"JWKS endpoint whose keys sign RS256, ES256 and EdDSA bearer tokens; refreshed, cached"`
	Issuer   string `envconfig:"AUTH_ISSUER" desc:"when set, a token's iss must match"`
	Audience string `envconfig:"AUTH_AUDIENCE" desc:"when set, a token's aud must include it"`
}

// ErrOpenNotLoopback is the one line of an ingest that would serve the
// world without authentication.
func ErrOpenNotLoopback(addr string) error {
	return fmt.Errorf("refusing to serve %s without authentication: set ALLOT_AUTH_HS256_KEY or ALLOT_AUTH_JWKS_URL, listen on a loopback address, or set ALLOT_AUTH=none", addr)
}

// Validate reports the first invalid value as one sentence; addr is
// ALLOT_HTTP_ADDR.
func (e AuthConfig) Validate(addr string) error {
	keyed := e.HS256Key != "" || e.JWKSURL != ""
	switch e.Mode {
	case "":
	case "none":
		if keyed {
			return errors.New("ALLOT_AUTH=none contradicts ALLOT_AUTH_HS256_KEY or ALLOT_AUTH_JWKS_URL: unset one or the other")
		}
	default:
		return fmt.Errorf("ALLOT_AUTH must be empty or none, got %q", e.Mode)
	}
	if e.HS256Key != "" && len(e.HS256Key) < auth.MinHS256Key {
		return fmt.Errorf("ALLOT_AUTH_HS256_KEY must be at least %d bytes, got %d", auth.MinHS256Key, len(e.HS256Key))
	}
	if !keyed && e.Mode != "none" && !Loopback(addr) {
		return ErrOpenNotLoopback(addr)
	}
	return nil
}

// Off reports whether authentication is off by choice (ALLOT_AUTH=none).
func (e AuthConfig) Off() bool { return e.Mode == "none" }

// Config is the verifier configuration; zero when no key is set.
func (e AuthConfig) Config() auth.Config {
	c := auth.Config{JWKSURL: e.JWKSURL, Issuer: e.Issuer, Audience: e.Audience}
	if e.HS256Key != "" {
		c.HS256Key = []byte(e.HS256Key)
	}
	return c
}

// Loopback reports whether the listen address addr (host:port) accepts
// connections from this machine only. An empty host listens everywhere.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
