package ui

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, name string, header map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/ui/"+name, nil)
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	serveAsset(w, r, name)
	return w
}

func TestPageNamesTheNumbersTestsRead(t *testing.T) {
	t.Parallel()
	w := get(t, pageFile, nil)
	if w.Code != http.StatusOK {
		t.Fatalf("page: %d, want 200", w.Code)
	}
	if got := w.Header().Get("Content-Type"); !strings.HasPrefix(got, "text/html") {
		t.Errorf("page Content-Type %q, want text/html", got)
	}
	if got := w.Header().Get("Content-Security-Policy"); got != contentSecurityPolicy {
		t.Errorf("page CSP %q, want %q", got, contentSecurityPolicy)
	}
	body := w.Body.String()
	for _, id := range []string{"capacity", "confirmed", "held", "held-hint", "waiting", "remaining", "rate", "lag", "allocator", "chart", "feed", "status", "activity-input", "watch"} {
		if !strings.Contains(body, `id="`+id+`"`) {
			t.Errorf("the page has no element with id %q", id)
		}
	}
	// Every asset the page links is embedded, and nothing is inline: the
	// CSP forbids inline scripts and styles.
	refs := regexp.MustCompile(`(?:src|href)="/ui/([^"]+)"`).FindAllStringSubmatch(body, -1)
	if len(refs) < 2 {
		t.Fatalf("the page links %d assets, want the script and the stylesheet", len(refs))
	}
	for _, m := range refs {
		if w := get(t, m[1], nil); w.Code != http.StatusOK {
			t.Errorf("linked asset %s: %d, want 200", m[1], w.Code)
		}
	}
	for _, bad := range []string{"<script>", "<style", " style=", "onclick="} {
		if strings.Contains(body, bad) {
			t.Errorf("the page contains %q, which its CSP blocks", bad)
		}
	}
}

func TestAssetsServeTypesAndRevalidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		wantType string
	}{
		{name: "app.js", wantType: "javascript"},
		{name: "app.css", wantType: "text/css"},
	}
	for _, tt := range tests {
		w := get(t, tt.name, nil)
		if w.Code != http.StatusOK || !strings.Contains(w.Header().Get("Content-Type"), tt.wantType) {
			t.Errorf("%s: %d %q, want 200 %s", tt.name, w.Code, w.Header().Get("Content-Type"), tt.wantType)
		}
		etag := w.Header().Get("ETag")
		if etag == "" || w.Header().Get("Cache-Control") != "no-cache" {
			t.Errorf("%s: ETag %q, Cache-Control %q; want an ETag and no-cache", tt.name, etag, w.Header().Get("Cache-Control"))
		}
		if w := get(t, tt.name, map[string]string{"If-None-Match": etag}); w.Code != http.StatusNotModified {
			t.Errorf("%s with If-None-Match: %d, want 304", tt.name, w.Code)
		}
	}
	w := get(t, "nope.js", nil)
	var e struct {
		Error string `json:"error"`
	}
	if w.Code != http.StatusNotFound || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Error == "" {
		t.Errorf("unknown asset: %d %q, want a JSON 404", w.Code, w.Body.String())
	}
}

func TestAcceptsHTML(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		accept []string
		want   bool
	}{
		{name: "browser", accept: []string{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}, want: true},
		{name: "no header", want: false},
		{name: "curl", accept: []string{"*/*"}, want: false},
		{name: "json client", accept: []string{"application/json"}, want: false},
		{name: "second header", accept: []string{"application/json", "text/html"}, want: true},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		for _, a := range tt.accept {
			r.Header.Add("Accept", a)
		}
		if got := AcceptsHTML(r); got != tt.want {
			t.Errorf("%s: AcceptsHTML = %v, want %v", tt.name, got, tt.want)
		}
	}
}
