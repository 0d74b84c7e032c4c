package ingest

import (
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/ingest/ui"
	"github.com/allot-dev/allot/internal/wire"
)

// The router is hand-written rather than an http.ServeMux because the
// contract wants JSON bodies on 404 and 405 and no redirects (ServeMux
// answers those in text and redirects unclean paths), and because matching
// a handful of fixed shapes by hand costs nothing on the hot path.

// endpoint is one method of one route.
type endpoint struct {
	method string
	label  string // metrics label: "METHOD pattern"
	h      func(w http.ResponseWriter, r *http.Request, a, b string)
}

// route is one path pattern with its methods.
type route struct {
	pattern   string
	allow     string // the Allow header of a 405
	notAllow  string // the sentence of a 405
	endpoints []endpoint
}

func newRoute(pattern string, eps ...endpoint) route {
	rt := route{pattern: pattern, endpoints: eps}
	var methods []string
	for i := range rt.endpoints {
		ep := &rt.endpoints[i]
		ep.label = ep.method + " " + pattern
		methods = append(methods, ep.method)
		if ep.method == http.MethodGet {
			methods = append(methods, http.MethodHead)
		}
	}
	rt.allow = strings.Join(methods, ", ")
	rt.notAllow = "This method is not allowed on this path; use " + joinOr(methods) + "."
	return rt
}

func joinOr(ms []string) string {
	if len(ms) == 1 {
		return ms[0]
	}
	return strings.Join(ms[:len(ms)-1], ", ") + " or " + ms[len(ms)-1]
}

// find returns the endpoint of method; HEAD is served by GET.
func (rt *route) find(method string) *endpoint {
	if method == http.MethodHead {
		method = http.MethodGet
	}
	for i := range rt.endpoints {
		if rt.endpoints[i].method == method {
			return &rt.endpoints[i]
		}
	}
	return nil
}

type routeID int

const (
	routeHealth routeID = iota
	routeReady
	routeMetrics
	routeActivity
	routeSignup
	routeClaim
	routeRequest
	// The live operator page (package ui).
	routePage
	routeAsset
	routeLive
	numRoutes
)

// unmatchedLabel is the route label of requests no route matches.
const unmatchedLabel = "unmatched"

type router struct {
	s      *Service
	routes [numRoutes]route
}

func (s *Service) routes(g prometheus.Gatherer) http.Handler {
	metricsHandler := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	rt := &router{s: s}
	rt.routes[routeHealth] = newRoute("/healthz",
		endpoint{method: http.MethodGet, h: s.handleHealth})
	rt.routes[routeReady] = newRoute("/readyz",
		endpoint{method: http.MethodGet, h: s.handleReady})
	rt.routes[routeMetrics] = newRoute("/metrics",
		endpoint{method: http.MethodGet, h: s.guard(operator, func(w http.ResponseWriter, r *http.Request, _, _ string) {
			metricsHandler.ServeHTTP(w, r)
		})})
	rt.routes[routeActivity] = newRoute("/v1/activities/{activity}",
		endpoint{method: http.MethodPut, h: s.guard(admin, s.writeHandler(wire.OpOpen))},
		endpoint{method: http.MethodGet, h: s.guard(anyCaller, s.handleActivity)})
	rt.routes[routeSignup] = newRoute("/v1/activities/{activity}/signups/{user}",
		endpoint{method: http.MethodPost, h: s.guard(self, s.writeHandler(wire.OpJoin))},
		endpoint{method: http.MethodDelete, h: s.guard(self, s.writeHandler(wire.OpCancel))},
		endpoint{method: http.MethodGet, h: s.guard(self, s.handleSignup)})
	rt.routes[routeClaim] = newRoute("/v1/activities/{activity}/claims/{user}",
		endpoint{method: http.MethodPost, h: s.guard(self, s.writeHandler(wire.OpClaim))})
	rt.routes[routeRequest] = newRoute("/v1/requests/{request_id}",
		endpoint{method: http.MethodGet, h: s.guard(anyCaller, s.handlePoll)})
	// The live operator page: / for browsers only, so that an API client
	// still gets the contract's JSON 404 there. The page and its assets are
	// a static shell holding no data (a browser cannot send a bearer token
	// when it navigates); the feed that fills it needs allot:operator.
	rt.routes[routePage] = newRoute("/",
		endpoint{method: http.MethodGet, h: func(w http.ResponseWriter, r *http.Request, _, _ string) {
			if !ui.AcceptsHTML(r) {
				writeError(w, http.StatusNotFound, msgNoRoute)
				return
			}
			s.ui.ServePage(w, r)
		}})
	rt.routes[routeAsset] = newRoute("/ui/{asset}",
		endpoint{method: http.MethodGet, h: func(w http.ResponseWriter, r *http.Request, name, _ string) {
			s.ui.ServeAsset(w, r, name)
		}})
	rt.routes[routeLive] = newRoute("/v1/activities/{activity}/live",
		endpoint{method: http.MethodGet, h: s.guard(operator, func(w http.ResponseWriter, r *http.Request, a, _ string) {
			activity, err := parseID(a, "activity")
			if err != nil {
				writeInputError(w, err)
				return
			}
			s.ui.ServeLive(w, r, activity)
		})})
	return rt
}

// match finds the route of path and its one or two path values. A path
// value is any non-empty segment; the handler validates it, so that
// /v1/activities/abc is a 400 (bad id), not a 404.
func match(path string) (routeID, string, string, bool) {
	switch path {
	case "/healthz":
		return routeHealth, "", "", true
	case "/readyz":
		return routeReady, "", "", true
	case "/metrics":
		return routeMetrics, "", "", true
	case "/":
		return routePage, "", "", true
	}
	if name, ok := strings.CutPrefix(path, "/ui/"); ok && name != "" && strings.IndexByte(name, '/') < 0 {
		return routeAsset, name, "", true
	}
	if rest, ok := strings.CutPrefix(path, "/v1/activities/"); ok {
		a, rest, more := strings.Cut(rest, "/")
		if a == "" {
			return 0, "", "", false
		}
		if !more {
			return routeActivity, a, "", true
		}
		if rest == "live" {
			return routeLive, a, "", true
		}
		kind, u, more := strings.Cut(rest, "/")
		if !more || u == "" || strings.IndexByte(u, '/') >= 0 {
			return 0, "", "", false
		}
		switch kind {
		case "signups":
			return routeSignup, a, u, true
		case "claims":
			return routeClaim, a, u, true
		}
		return 0, "", "", false
	}
	if id, ok := strings.CutPrefix(path, "/v1/requests/"); ok && id != "" && strings.IndexByte(id, '/') < 0 {
		return routeRequest, id, "", true
	}
	return 0, "", "", false
}

// ServeHTTP routes r, answers 404 and 405 in JSON, turns a panic into a
// logged 500 and counts every answer by route pattern and code.
func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	label := unmatchedLabel
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler { //nolint:errorlint // a sentinel panic value, compared as net/http does
				rt.s.metrics.countRequest(label, sw.code)
				panic(p)
			}
			rt.s.log.ErrorContext(r.Context(), "panic in handler",
				slog.String("method", r.Method), slog.String("route", label),
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			if sw.code == 0 {
				writeError(sw, http.StatusInternalServerError, msgInternal)
			}
		}
		rt.s.metrics.countRequest(label, sw.code)
	}()
	id, a, b, ok := match(r.URL.Path)
	if !ok {
		writeError(sw, http.StatusNotFound, msgNoRoute)
		return
	}
	route := &rt.routes[id]
	ep := route.find(r.Method)
	if ep == nil {
		label = route.pattern
		sw.Header()["Allow"] = []string{route.allow}
		writeError(sw, http.StatusMethodNotAllowed, route.notAllow)
		return
	}
	label = ep.label
	ep.h(sw, r, a, b)
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
