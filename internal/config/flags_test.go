package config_test

import (
	"bytes"
	"flag"
	"testing"

	"github.com/allot-dev/allot/internal/config"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"no flags: go on", nil, -1},
		{"-version: exit 0", []string{"-version"}, 0},
		{"-h: exit 0", []string{"-h"}, 0},
		{"a bad flag: exit 2", []string{"-nope"}, 2},
		{"a stray argument: exit 2", []string{"x"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("ingest", flag.ContinueOnError)
			fs.SetOutput(&bytes.Buffer{})
			if got := config.ParseFlags(fs, tt.args); got != tt.want {
				t.Errorf("ParseFlags(%q) = %d, want %d", tt.args, got, tt.want)
			}
		})
	}
}
