package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
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
