package store

import (
	"strings"
	"testing"
)

func TestSplitEvents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		in        string
		n         int
		want      []string
		wantFirst []int
	}{
		{name: "fits", in: "a:1;b:2", n: 7, want: []string{"a:1;b:2"}, wantFirst: []int{0}},
		{name: "cut between events", in: "a:1;b:2;c:3", n: 7, want: []string{"a:1;b:2", "c:3"}, wantFirst: []int{0, 2}},
		{name: "one a piece", in: "a:1;b:22;c:3", n: 4, want: []string{"a:1", "b:22", "c:3"}, wantFirst: []int{0, 1, 2}},
		{name: "cut on the separator", in: "a:1;b:2", n: 3, want: []string{"a:1", "b:2"}, wantFirst: []int{0, 1}},
	}
	for _, tt := range tests {
		got, first := splitEvents(tt.in, tt.n)
		if strings.Join(got, "|") != strings.Join(tt.want, "|") || len(first) != len(tt.wantFirst) {
			t.Errorf("%s: pieces %q first %v, want %q %v", tt.name, got, first, tt.want, tt.wantFirst)
			continue
		}
		for i := range first {
			if first[i] != tt.wantFirst[i] {
				t.Errorf("%s: first %v, want %v", tt.name, first, tt.wantFirst)
			}
			if len(got[i]) > tt.n {
				t.Errorf("%s: piece %q longer than %d", tt.name, got[i], tt.n)
			}
		}
		if strings.Join(got, ";") != tt.in {
			t.Errorf("%s: pieces %q do not join back to %q", tt.name, got, tt.in)
		}
	}
}

func TestSplitBytes(t *testing.T) {
	t.Parallel()
	in := "[1,22,333,4444]"
	for n := 1; n <= len(in)+1; n++ {
		got := splitBytes(in, n)
		if strings.Join(got, "") != in {
			t.Fatalf("n=%d: %q does not join back", n, got)
		}
		for _, p := range got {
			if len(p) > n || p == "" {
				t.Fatalf("n=%d: piece %q", n, p)
			}
		}
	}
}

func TestTruncateKeepsValidUTF8(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("é", 300) + "\xff"
	got := truncate(s, 255)
	if !strings.HasPrefix(s, got) || len([]rune(got)) != 255 {
		t.Fatalf("truncate to 255 characters: %d characters, %d bytes", len([]rune(got)), len(got))
	}
	if got := truncate("ab\xffc", 10); got != "ab?c" {
		t.Fatalf("invalid UTF-8: %q, want %q", got, "ab?c")
	}
}
