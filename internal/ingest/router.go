package ingest

import (
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/ingest/reply"
	"github.com/allot-dev/allot/internal/ingest/ui"
	"github.com/allot-dev/allot/internal/wire"
)

// The routes are an http.ServeMux with method-and-wildcard patterns. The
// API (api/openapi.yaml) wants JSON bodies on 404 and 405 and no redirects, which the
// ServeMux alone does not give (it answers those in text and redirects
// unclean paths), so:
//   - every path pattern is also registered without a method, answering the
//     JSON 405 with the route's Allow header;
//   - "/" catches every path no route matches, answering the JSON 404;
//   - router.ServeHTTP answers 404 itself for a path with an empty segment
//     (//), which no route has and the mux would redirect, and hands the mux
//     a path escaped segment by segment, so that it splits the decoded path
//     where it has a slash and takes "." and ".." as path values instead of
//     cleaning them away.
// A path value is any non-empty segment; the handler validates it, so that
// /v1/activities/abc is a 400 (bad id), not a 404.

// endpoint is one method of one route.
type endpoint struct {
	method string
	h      http.HandlerFunc
}

// unmatchedLabel is the route label of requests no route matches.
const unmatchedLabel = "unmatched"

type router struct {
	s   *Service
	mux *http.ServeMux
	// labels maps each registered pattern to its metrics label: "METHOD
	// path" for an endpoint, the path for its 405, unmatched for the 404.
	labels map[string]string
}

func (s *Service) routes(g prometheus.Gatherer) http.Handler {
	metricsHandler := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	rt := &router{s: s, mux: http.NewServeMux(), labels: map[string]string{}}
	rt.handle("/healthz",
		endpoint{http.MethodGet, s.handleHealth})
	rt.handle("/readyz",
		endpoint{http.MethodGet, s.handleReady})
	rt.handle("/metrics",
		endpoint{http.MethodGet, s.callers.access.Guard(access.Operator, metricsHandler.ServeHTTP)})
	rt.handle("/v1/activities/{activity}",
		endpoint{http.MethodPut, s.callers.access.Guard(access.Admin, s.writeHandler(wire.OpOpen))},
		endpoint{http.MethodGet, s.callers.access.Guard(access.AnyCaller, s.handleActivity)})
	rt.handle("/v1/activities/{activity}/signups/{user}",
		endpoint{http.MethodPost, s.callers.access.Guard(access.Self, s.writeHandler(wire.OpJoin))},
		endpoint{http.MethodDelete, s.callers.access.Guard(access.Self, s.writeHandler(wire.OpCancel))},
		endpoint{http.MethodGet, s.callers.access.Guard(access.Self, s.handleSignup)})
	rt.handle("/v1/activities/{activity}/signups/{user}/confirm",
		endpoint{http.MethodPost, s.callers.access.Guard(access.Self, s.writeHandler(wire.OpConfirm))})
	rt.handle("/v1/activities/{activity}/claims/{user}",
		endpoint{http.MethodPost, s.callers.access.Guard(access.Self, s.writeHandler(wire.OpClaim))})
	rt.handle("/v1/requests/{request_id}",
		endpoint{http.MethodGet, s.callers.access.Guard(access.AnyCaller, s.handlePoll)})
	// The live operator page: / for browsers only, so that an API client
	// still gets the API's JSON 404 there. The page and its assets are
	// a static shell holding no data (a browser cannot send a bearer token
	// when it navigates); the feed that fills it needs allot:operator.
	rt.handle("/",
		endpoint{http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
			if !ui.AcceptsHTML(r) {
				reply.Error(w, http.StatusNotFound, reply.MsgNoRoute)
				return
			}
			s.ui.ServePage(w, r)
		}})
	rt.handle("/ui/{asset}",
		endpoint{http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
			s.ui.ServeAsset(w, r, r.PathValue("asset"))
		}})
	rt.handle("/v1/activities/{activity}/live",
		endpoint{http.MethodGet, s.callers.access.Guard(access.Operator, func(w http.ResponseWriter, r *http.Request) {
			activity, err := reply.ParseID(r.PathValue("activity"), "activity")
			if err != nil {
				reply.Input(w, err)
				return
			}
			s.ui.ServeLive(w, r, activity)
		})})
	rt.mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		reply.Error(w, http.StatusNotFound, reply.MsgNoRoute)
	})
	rt.labels["/"] = unmatchedLabel
	return rt
}

// handle registers the endpoints of path, and its 405 for every other
// method. HEAD is served by GET.
func (rt *router) handle(path string, eps ...endpoint) {
	pattern := path
	if path == "/" {
		pattern = "/{$}" // / alone, not the subtree
	}
	var methods []string
	for _, ep := range eps {
		rt.mux.HandleFunc(ep.method+" "+pattern, ep.h)
		rt.labels[ep.method+" "+pattern] = ep.method + " " + path
		methods = append(methods, ep.method)
		if ep.method == http.MethodGet {
			methods = append(methods, http.MethodHead)
		}
	}
	allow := []string{strings.Join(methods, ", ")}
	notAllowed := "This method is not allowed on this path; use " + joinOr(methods) + "."
	rt.mux.HandleFunc(pattern, func(w http.ResponseWriter, _ *http.Request) {
		w.Header()["Allow"] = allow
		reply.Error(w, http.StatusMethodNotAllowed, notAllowed)
	})
	rt.labels[pattern] = path
}

func joinOr(ms []string) string {
	if len(ms) == 1 {
		return ms[0]
	}
	return strings.Join(ms[:len(ms)-1], ", ") + " or " + ms[len(ms)-1]
}

// label is the metrics label of the pattern the mux matched ("" when it
// was not asked).
func (rt *router) label(pattern string) string {
	if l, ok := rt.labels[pattern]; ok {
		return l
	}
	if pattern == "" {
		return unmatchedLabel
	}
	return pattern
}

// ServeHTTP routes r, answers 404 and 405 in JSON, turns a panic into a
// logged 500 and counts every answer by route pattern and code.
func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	mr := r // the request the mux routes; it records the pattern matched
	defer func() {
		label := rt.label(mr.Pattern)
		nameSpan(r, label)
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler { //nolint:errorlint // a sentinel panic value, compared as net/http does
				rt.s.metrics.countRequest(label, sw.code)
				panic(p)
			}
			rt.s.deps.Log.ErrorContext(r.Context(), "panic in handler",
				slog.String("method", r.Method), slog.String("route", label),
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			if sw.code == 0 {
				reply.Error(sw, http.StatusInternalServerError, reply.MsgInternal)
			}
		}
		rt.s.metrics.countRequest(label, sw.code)
	}()
	path := r.URL.Path
	if path == "" || path[0] != '/' || strings.Contains(path, "//") {
		// No route has an empty segment; the mux would redirect these.
		reply.Error(sw, http.StatusNotFound, reply.MsgNoRoute)
		return
	}
	if r.URL.RawPath != "" || hasDotSegment(path) {
		u := *r.URL
		u.RawPath = muxPath(path)
		mr = new(http.Request)
		*mr = *r
		mr.URL = &u
	}
	rt.mux.ServeHTTP(sw, mr)
}

// hasDotSegment reports whether path has a segment "." or "..", which the
// mux would clean away.
func hasDotSegment(path string) bool {
	for i := 0; i < len(path); i++ {
		if path[i] != '/' || i+1 >= len(path) || path[i+1] != '.' {
			continue
		}
		rest := path[i+2:]
		if rest == "" || rest[0] == '/' || rest == "." || strings.HasPrefix(rest, "./") {
			return true
		}
	}
	return false
}

// muxPath escapes path (decoded, clean of empty segments) segment by
// segment, "." and ".." too: the mux matches the escaped path, so that it
// then splits where the decoded path has a slash (a %2F in the request
// separates segments, as r.URL.Path has it) and neither cleans nor
// redirects a dot segment.
func muxPath(path string) string {
	var b strings.Builder
	b.Grow(len(path) + 8)
	for seg := range strings.SplitSeq(path[1:], "/") {
		b.WriteByte('/')
		switch seg {
		case ".":
			b.WriteString("%2E")
		case "..":
			b.WriteString("%2E%2E")
		default:
			b.WriteString(url.PathEscape(seg))
		}
	}
	return b.String()
}

// statusWriter remembers the status code written, for the metrics and the
// panic handler.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
