package main

import (
	"net/http"
	_ "net/http/pprof" // profiling of the development stack, on ALLOT_PPROF_ADDR only

	"github.com/allot-dev/allot/internal/binaries"
)

// The development stack serves Go's profiles when ALLOT_PPROF_ADDR names a
// listen address (e.g. 127.0.0.1:6060), for finding where a burst's time
// goes: go tool pprof http://127.0.0.1:6060/debug/pprof/profile?seconds=5
func init() {
	if addr := binaries.Getenv[binaries.StackGetenv]().PprofAddr; addr != "" {
		go http.ListenAndServe(addr, nil) //nolint:errcheck,gosec // a developer's tool, off by default
	}
}
