package auth

import (
	"errors"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Claims are what MintHS256 puts in a development token.
type Claims struct {
	Subject  string
	Scopes   []string
	Issuer   string
	Audience string
	TTL      time.Duration
}

// MintHS256 signs a token for c with key: the development tool behind
// `make token` and the tests. Production tokens come from an identity
// provider.
func MintHS256(key []byte, c Claims) (string, error) {
	if len(key) < MinHS256Key {
		return "", errors.New("auth: the HS256 key must be at least 32 bytes")
	}
	if c.TTL <= 0 {
		c.TTL = time.Hour
	}
	now := time.Now()
	rc := claims{RegisteredClaims: jwt.RegisteredClaims{
		Subject:   c.Subject,
		Issuer:    c.Issuer,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(c.TTL)),
	}, Scope: strings.Join(c.Scopes, " ")}
	if c.Audience != "" {
		rc.Audience = jwt.ClaimStrings{c.Audience}
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, rc).SignedString(key)
}
