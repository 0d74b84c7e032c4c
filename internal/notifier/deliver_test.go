package notifier

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"
)

func TestBackoffIsCappedFullJitter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		attempt int
		base    time.Duration
		ceiling time.Duration
		want    time.Duration // the upper bound
	}{
		{name: "first", attempt: 1, base: 100 * time.Millisecond, ceiling: time.Minute, want: 100 * time.Millisecond},
		{name: "third doubles twice", attempt: 3, base: 100 * time.Millisecond, ceiling: time.Minute, want: 400 * time.Millisecond},
		{name: "capped", attempt: 10, base: 100 * time.Millisecond, ceiling: time.Second, want: time.Second},
		{name: "huge attempt does not overflow", attempt: 1000, base: time.Second, ceiling: time.Hour, want: time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var low, high bool
			for range 2000 {
				d := Backoff(tt.attempt, tt.base, tt.ceiling)
				if d < 0 || d > tt.want {
					t.Fatalf("Backoff(%d, %s, %s) = %s, want within [0, %s]", tt.attempt, tt.base, tt.ceiling, d, tt.want)
				}
				low = low || d < tt.want/4
				high = high || d > tt.want*3/4
			}
			if !low || !high {
				t.Errorf("Backoff(%d) is not spread over [0, %s]: low %v, high %v", tt.attempt, tt.want, low, high)
			}
		})
	}
}

func TestStatusClassification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code int
		want bool // permanent
	}{
		{400, true}, {401, true}, {403, true}, {404, true}, {410, true}, {422, true},
		{408, false}, {409, false}, {425, false}, {429, false},
		{300, false}, {302, false}, {500, false}, {502, false}, {503, false}, {504, false},
	}
	for _, tt := range tests {
		err := fmt.Errorf("attempt: %w", &StatusError{StatusCode: tt.code})
		if got := errors.Is(err, ErrPermanent); got != tt.want {
			t.Errorf("status %d: permanent %v, want %v", tt.code, got, tt.want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want time.Duration
	}{
		{name: "absent", in: "", want: 0},
		{name: "seconds", in: "3", want: 3 * time.Second},
		{name: "zero", in: "0", want: 0},
		{name: "negative", in: "-4", want: 0},
		{name: "garbage", in: "soon", want: 0},
		{name: "past date", in: time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat), want: 0},
	}
	for _, tt := range tests {
		if got := parseRetryAfter(tt.in); got != tt.want {
			t.Errorf("%s: parseRetryAfter(%q) = %s, want %s", tt.name, tt.in, got, tt.want)
		}
	}
	if got := parseRetryAfter(time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)); got < 58*time.Minute || got > time.Hour {
		t.Errorf("future date: parseRetryAfter = %s, want about an hour", got)
	}
}

func TestDecodeEvent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		data    string
		wantErr bool
	}{
		{name: "event", data: `{"event_id":"0190b3a4-7c1e-7000-8000-000000000001","kind":"promoted","activity_id":1}`},
		{name: "unknown fields kept out of the way", data: `{"event_id":"e-1","extra":true}`},
		{name: "not json", data: `promoted!`, wantErr: true},
		{name: "json array", data: `[1,2]`, wantErr: true},
		{name: "no event_id", data: `{"kind":"promoted"}`, wantErr: true},
		{name: "event_id with a newline", data: `{"event_id":"a\nb"}`, wantErr: true},
		{name: "event_id with a space", data: `{"event_id":"a b"}`, wantErr: true},
	}
	for _, tt := range tests {
		_, err := decodeEvent([]byte(tt.data))
		if (err != nil) != tt.wantErr {
			t.Errorf("%s: decodeEvent = %v, want error %v", tt.name, err, tt.wantErr)
		}
		if err != nil && !errors.Is(err, ErrMalformedEvent) {
			t.Errorf("%s: %v is not ErrMalformedEvent", tt.name, err)
		}
	}
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	if got := oneLine("a\r\nb\t c  ", 100); got != "a b c" {
		t.Errorf("oneLine = %q", got)
	}
	if got := oneLine("abcdef", 3); got != "abc" {
		t.Errorf("oneLine truncates to %q", got)
	}
}
