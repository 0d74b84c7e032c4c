package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/auth"
)

func TestFlagErrorsExit2(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"bad mix weight", []string{"-activity", "1", "-capacity", "5", "-mix", "claim=x"}, "-mix"},
		{"unknown op in mix", []string{"-activity", "1", "-capacity", "5", "-mix", "buy=1"}, "unknown op"},
		{"all-zero mix", []string{"-activity", "1", "-capacity", "5", "-mix", "claim=0,join=0,cancel=0"}, "every weight is zero"},
		{"negative weight", []string{"-activity", "1", "-capacity", "5", "-mix", "claim=-1,join=1"}, "non-negative"},
		{"no activity", []string{"-capacity", "5"}, "-activity is required"},
		{"no capacity", []string{"-activity", "1"}, "-capacity is required"},
		{"bad url", []string{"-url", "localhost", "-activity", "1", "-capacity", "5"}, "-url"},
		{"zero requests", []string{"-activity", "1", "-capacity", "5", "-n", "0"}, "-n"},
		{"zero workers", []string{"-activity", "1", "-capacity", "5", "-c", "0"}, "-c"},
		{"unknown flag", []string{"-activity", "1", "-capacity", "5", "-bogus"}, "bogus"},
		{"stray argument", []string{"-activity", "1", "-capacity", "5", "extra"}, "unexpected arguments"},
		{"bad hold", []string{"-activity", "1", "-capacity", "5", "-hold", "-1s"}, "-hold"},
		{"hold too long", []string{"-activity", "1", "-capacity", "5", "-hold", "200h"}, "-hold"},
		{"hold with -no-open", []string{"-activity", "1", "-no-open", "-hold", "2s"}, "-no-open"},
		{"no-show without a hold", []string{"-activity", "1", "-capacity", "5", "-no-show", "0.3"}, "-no-show needs -hold"},
		{"no-show above 1", []string{"-activity", "1", "-capacity", "5", "-hold", "2s", "-no-show", "1.3"}, "-no-show"},
		{"confirm weight", []string{"-activity", "1", "-capacity", "5", "-mix", "confirm=x"}, "-mix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), tt.args, &stdout, &stderr, false); code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr does not mention %q:\n%s", tt.want, stderr.String())
			}
			if !strings.Contains(stderr.String(), "usage:") {
				t.Errorf("stderr has no usage text:\n%s", stderr.String())
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"-url", "http://h:1/", "-activity", "9", "-capacity", "100", "-n", "2000",
		"-c", "32", "-mix", "claim=2,join=1", "-json"}, &stderr)
	if err != nil {
		t.Fatalf("parseFlags: %v\n%s", err, stderr.String())
	}
	c := o.cfg
	if c.BaseURL != "http://h:1/" || c.Activity != 9 || c.Capacity != 100 || c.Requests != 2000 || c.UserCount() != 2000 ||
		c.Concurrency != 32 || c.Mix.Claim != 2 || c.Mix.Join != 1 || c.Mix.Cancel != 0 || !o.json {
		t.Errorf("parsed %+v json=%v; want the flags, users defaulting to -n", c, o.json)
	}
	o, err = parseFlags([]string{"-activity", "9", "-capacity", "100", "-mix", "claim=1,join=1,confirm=1",
		"-hold", "2s", "-no-show", "0.3", "-settle-timeout", "1m"}, &stderr)
	if c := o.cfg; err != nil || c.Hold != 2*time.Second || c.NoShow != 0.3 || c.SettleTimeout != time.Minute || c.Mix.Confirm != 1 {
		t.Errorf("hold flags: parsed %+v, %v", c, err)
	}
}

// claimServer is a tiny synchronous claim API, right or oversold on demand.
func claimServer(oversell bool) http.Handler {
	var mu sync.Mutex
	var capacity, granted int64
	owners := map[string]bool{}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/activities/{a}", func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Capacity int64 }
		json.NewDecoder(r.Body).Decode(&body) //nolint:errcheck // a zero capacity fails the test anyway
		mu.Lock()
		capacity = body.Capacity
		mu.Unlock()
		fmt.Fprint(w, `{"request_id":"x","state":"done","op":"open","outcome":"OPENED"}`)
	})
	mux.HandleFunc("GET /v1/activities/{a}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, `{"capacity":%d,"confirmed":%d,"waiting":0,"remaining":%d}`, capacity, granted, capacity-granted)
	})
	mux.HandleFunc("POST /v1/activities/{a}/claims/{u}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		u := r.PathValue("u")
		out := "SOLD_OUT"
		switch {
		case owners[u]:
			out = "ALREADY_OWNED"
		case granted < capacity || oversell:
			owners[u] = true
			granted++
			out = "GRANTED"
		}
		fmt.Fprintf(w, `{"request_id":"r","state":"done","op":"claim","outcome":%q}`, out)
	})
	return mux
}

func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		name     string
		oversell bool
		want     int
	}{
		{"a correct server passes", false, 0},
		{"an oversold server fails", true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(claimServer(tt.oversell))
			defer srv.Close()
			var stdout, stderr bytes.Buffer
			args := []string{"-url", srv.URL, "-activity", "1", "-capacity", "10", "-n", "200", "-users", "150", "-c", "8", "-json"}
			if code := run(context.Background(), args, &stdout, &stderr, true); code != tt.want {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.want, stdout.String(), stderr.String())
			}
			var rep map[string]any
			if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
				t.Fatalf("-json output is not one JSON object: %v\n%s", err, stdout.String())
			}
			if rep["pass"] != (tt.want == 0) {
				t.Errorf("pass = %v in %s", rep["pass"], stdout.String())
			}
			if strings.Contains(stderr.String(), "burst") {
				t.Errorf("a progress bar was drawn with -json:\n%s", stderr.String())
			}
		})
	}
}

func TestRunUnreachableExit2(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-url", "http://127.0.0.1:1", "-activity", "1", "-capacity", "1", "-n", "1"},
		&stdout, &stderr, false)
	if code != 2 || !strings.Contains(stderr.String(), "open the activity") {
		t.Fatalf("exit %d, want 2 with one clear line; stderr:\n%s", code, stderr.String())
	}
}

// TestRunPrintsItsConfigWithoutSecrets: the line loadgen prints at start
// says how it authenticates, never the token or the key.
func TestRunPrintsItsConfigWithoutSecrets(t *testing.T) {
	key := "loadgen-test-key-0123456789abcdef0123"
	for _, c := range []struct {
		name, token, key, want string
	}{
		{"no token", "", "", "auth=none"},
		{"ALLOT_TOKEN", "secret-token-value", "", "auth=bearer token (****)"},
		{"a key", "", key, "auth=tokens minted with ALLOT_AUTH_HS256_KEY (****)"},
	} {
		t.Setenv("ALLOT_TOKEN", c.token)
		t.Setenv("ALLOT_AUTH_HS256_KEY", c.key)
		var stdout, stderr bytes.Buffer
		run(context.Background(), []string{"-url", "http://127.0.0.1:1", "-activity", "1", "-capacity", "1", "-n", "1"},
			&stdout, &stderr, false)
		out := stderr.String()
		if !strings.Contains(out, c.want) || !strings.Contains(out, "url=http://127.0.0.1:1") {
			t.Errorf("%s: stderr %q, want the config line with %q", c.name, out, c.want)
		}
		if strings.Contains(out, "secret-token-value") || strings.Contains(out, key) {
			t.Errorf("%s: a secret is printed: %q", c.name, out)
		}
	}
}

// TestTokens: -token (or ALLOT_TOKEN) is sent as is; with
// ALLOT_AUTH_HS256_KEY instead, loadgen mints an admin token for the open
// and one token per simulated user, whose sub is that user.
func TestTokens(t *testing.T) {
	t.Setenv("ALLOT_TOKEN", "")
	t.Setenv("ALLOT_AUTH_HS256_KEY", "")
	o, err := parseFlags([]string{"-activity", "1", "-capacity", "1", "-token", "abc"}, io.Discard)
	if err != nil || o.cfg.Token != "abc" || o.userToken != nil {
		t.Fatalf("-token abc: token %q, per-user %v, err %v; want abc and no per-user tokens", o.cfg.Token, o.userToken != nil, err)
	}
	t.Setenv("ALLOT_TOKEN", "from-env")
	if o, err := parseFlags([]string{"-activity", "1", "-capacity", "1"}, io.Discard); err != nil || o.cfg.Token != "from-env" {
		t.Fatalf("ALLOT_TOKEN: token %q, err %v; want from-env", o.cfg.Token, err)
	}
	t.Setenv("ALLOT_TOKEN", "")
	key := "loadgen-test-key-0123456789abcdef0123"
	t.Setenv("ALLOT_AUTH_HS256_KEY", key)
	o, err = parseFlags([]string{"-activity", "1", "-capacity", "1"}, io.Discard)
	if err != nil || o.cfg.Token == "" || o.userToken == nil {
		t.Fatalf("with a key: token %q, per-user %v, err %v; want both", o.cfg.Token, o.userToken != nil, err)
	}
	v, err := auth.New(auth.Config{HS256Key: []byte(key)})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if id, err := v.Verify(context.Background(), o.cfg.Token); err != nil || !id.Admin {
		t.Fatalf("the open's token: %+v, %v; want an admin", id, err)
	}
	if id, err := v.Verify(context.Background(), o.userToken(42)); err != nil || id.User != 42 || id.Admin {
		t.Fatalf("user 42's token: %+v, %v; want user 42 without scopes", id, err)
	}
}
