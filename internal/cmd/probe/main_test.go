package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{srv.URL + "/readyz"}, 0},
		{[]string{srv.URL + "/other"}, 1},
		{[]string{"http://127.0.0.1:1/readyz"}, 1},
		{nil, 2},
		{[]string{"::bad"}, 2},
	} {
		if got := run(tc.args, io.Discard); got != tc.want {
			t.Errorf("probe %v = %d, want %d", tc.args, got, tc.want)
		}
	}
}
