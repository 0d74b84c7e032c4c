package access

import (
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/auth"
)

// TestAuthConfigSecureByDefault: with no key, ingest runs open only on a
// loopback address or with ALLOT_AUTH=none; otherwise one line refuses.
func TestAuthConfigSecureByDefault(t *testing.T) {
	t.Parallel()
	key := strings.Repeat("k", auth.MinHS256Key)
	tests := []struct {
		name string
		env  AuthConfig
		addr string
		want string // "" = valid; else a part of the one-line error
	}{
		{name: "no key, all interfaces", addr: ":8080", want: "refusing to serve :8080 without authentication"},
		{name: "no key, 0.0.0.0", addr: "0.0.0.0:8080", want: "refusing"},
		{name: "no key, a public address", addr: "10.1.2.3:8080", want: "refusing"},
		{name: "no key, 127.0.0.1", addr: "127.0.0.1:8080"},
		{name: "no key, ::1", addr: "[::1]:8080"},
		{name: "no key, localhost", addr: "localhost:8080"},
		{name: "none, all interfaces", env: AuthConfig{Mode: "none"}, addr: ":8080"},
		{name: "HS256 key", env: AuthConfig{HS256Key: key}, addr: ":8080"},
		{name: "JWKS", env: AuthConfig{JWKSURL: "https://idp.example/jwks"}, addr: ":8080"},
		{name: "short key", env: AuthConfig{HS256Key: "short"}, addr: ":8080", want: "at least 32 bytes"},
		{name: "none with a key", env: AuthConfig{Mode: "none", HS256Key: key}, addr: ":8080", want: "contradicts"},
		{name: "unknown mode", env: AuthConfig{Mode: "off"}, addr: "127.0.0.1:8080", want: "must be empty or none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.env.Validate(tt.addr)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate = %v, want valid", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate = %v, want an error containing %q", err, tt.want)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Fatalf("Validate = %q, want one line", err)
			}
		})
	}
}
