package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestUsageErrorsExit2(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown design", []string{"-design", "queue"}, "-design must be claim, gated, join or floor"},
		{"pool too small", []string{"-design", "claim", "-max-conns", "0"}, "-max-conns"},
		{"unknown flag", []string{"-bogus"}, "bogus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(context.Background(), tt.args, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr does not mention %q:\n%s", tt.want, stderr.String())
			}
		})
	}
}

// TestFloorNeedsNoDatabase: the floor serves with no database reachable,
// until it is stopped; a seed design refuses to start without one.
func TestFloorNeedsNoDatabase(t *testing.T) {
	t.Setenv("ALLOT_MYSQL_DSN", "root@tcp(127.0.0.1:1)/nothing?timeout=200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var stderr bytes.Buffer
	if code := run(ctx, []string{"-design", "floor", "-addr", "127.0.0.1:0"}, &stderr); code != 0 {
		t.Fatalf("floor: exit %d, want 0 once stopped; stderr:\n%s", code, stderr.String())
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"-design", "claim", "-addr", "127.0.0.1:0"}, &stderr); code != 2 {
		t.Fatalf("claim without a database: exit %d, want 2; stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "start MariaDB/MySQL") {
		t.Errorf("stderr does not say what to start:\n%s", stderr.String())
	}
}
