package config

import (
	"bytes"
	"strings"
	"testing"
)

func TestMaskURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, in, want string }{
		{"no userinfo", "nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"user and password", "nats://ingest:s3cret@nats:4222", "nats://ingest:*****@nats:4222"},
		{"token", "nats://tok3n@nats:4222", "nats://*****@nats:4222"},
		{"a password with @ and /", "nats://ingest:p@ss/w@nats:4222", "nats://ingest:*****@nats:4222"},
		{"a list", "nats://a:pw1@n1:4222,nats://a:pw2@n2:4222", "nats://a:*****@n1:4222,nats://a:*****@n2:4222"},
	}
	for _, tt := range tests {
		if got := MaskURL(tt.in); got != tt.want {
			t.Errorf("%s: MaskURL(%q) = %q, want %q", tt.name, tt.in, got, tt.want)
		}
		if strings.Contains(MaskURL(tt.in), "s3cret") || strings.Contains(MaskURL(tt.in), "pw1") {
			t.Errorf("%s: a secret survives", tt.name)
		}
	}
}

func TestMaskDSN(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"ingest:s3cret@tcp(db:3306)/allot?parseTime=true",
		"ingest:s3cret@tcp(db:3306)/allot?parseTime=true&tls=custom&bad=%zz", // does not parse
		"ingest:s3cret@tcp(db:3306",                                          // does not parse
	} {
		got := MaskDSN(dsn)
		if strings.Contains(got, "s3cret") || !strings.Contains(got, "ingest:") {
			t.Errorf("MaskDSN(%q) = %q, want the user kept and the password masked", dsn, got)
		}
	}
}

func TestPrintMasksSecrets(t *testing.T) {
	t.Parallel()
	var spec struct {
		Common
		Key  string `envconfig:"AUTH_HS256_KEY"`
		JWKS string `envconfig:"AUTH_JWKS_URL"`
	}
	spec.NATSURL = "nats://allocator:natspw@nats:4222"
	spec.MySQLDSN = "allocator:mysqlpw@tcp(db:3306)/allot"
	spec.Key = "hs256-secret-of-at-least-32-bytes"
	spec.JWKS = "https://idp.example/jwks"
	var b bytes.Buffer
	Print(&b, "test", &spec)
	for _, secret := range []string{"natspw", "mysqlpw", "hs256-secret"} {
		if strings.Contains(b.String(), secret) {
			t.Errorf("the printout shows %q:\n%s", secret, b.String())
		}
	}
	if !strings.Contains(b.String(), "https://idp.example/jwks") {
		t.Errorf("the printout hides the JWKS URL, which is no secret:\n%s", b.String())
	}
}

// TestValidateHidesThePassword: the one-line error of a DSN that does not
// parse never shows its password.
func TestValidateHidesThePassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"allot:s3cret@tcp(db:3306",
		"allot:s3cret@tcp(db:3306)/allot?parseTime=maybe",
		"allot:s3cret@tcp(db:3306)allot",
		"allot:s3cret@tcp(db:3306)/allot?tls=nosuchconfig",
	} {
		c := Common{MySQLDSN: dsn, MySQLMaxConns: 1, LogLevel: "info"}
		err := c.Validate()
		if err == nil {
			t.Errorf("Validate(%q) = nil, want an error", dsn)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Validate(%q) = %q shows the password", dsn, err)
		}
	}
}
