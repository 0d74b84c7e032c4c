package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

// static holds the page: plain HTML, CSS and JavaScript, served as written.
//
//go:embed static
var static embed.FS

// asset is one embedded file, ready to serve.
type asset struct {
	body  []byte
	ctype string
	etag  string
}

// assets maps a file name under static/ to its asset.
var assets = func() map[string]asset {
	m := make(map[string]asset)
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		m[strings.TrimPrefix(p, "static/")] = asset{body: body, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic("ui: read the embedded assets: " + err.Error())
	}
	return m
}()

// pageFile is the page served at /.
const pageFile = "index.html"

// contentSecurityPolicy allows the page its own scripts, styles and feed
// only: no inline script, nothing from elsewhere.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// AcceptsHTML reports whether r's client takes an HTML page, as browsers
// say they do. ingest serves the page at / to them only; API clients keep
// the API's JSON 404 for a path that is not a route.
func AcceptsHTML(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, "text/html") {
			return true
		}
	}
	return false
}

// ServePage serves GET / : the operator page. It reads the activity to
// watch from ?activity=N or from its own form.
func (s *Server) ServePage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Vary", "Accept")
	serveAsset(w, r, pageFile)
}

// ServeAsset serves GET /ui/{name}: the page's stylesheet and script.
func (s *Server) ServeAsset(w http.ResponseWriter, r *http.Request, name string) {
	serveAsset(w, r, name)
}

func serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	a, ok := assets[name]
	if !ok {
		writeError(w, http.StatusNotFound, msgNoAsset)
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("ETag", a.etag)
	// Revalidate every time: the ETag makes that a 304, and a new build's
	// page is never mixed with an old build's script.
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if strings.HasSuffix(name, ".html") {
		h.Set("Content-Security-Policy", contentSecurityPolicy)
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.body))
}
