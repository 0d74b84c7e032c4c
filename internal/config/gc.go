package config

import "runtime/debug"

// DefaultGCPercent is the garbage collector's target of allot's servers
// (ingest, the allocator, and both in one process under make run) when
// GOGC is not set: between collections the heap may grow to three times
// what is live, where Go's default is two. Their live heaps are small and
// they allocate for every request, so at Go's default a burst spends a
// tenth of the servers' CPU collecting; at 200 it collects half as often
// (docs/operations.md, "Memory and the garbage collector").
const DefaultGCPercent = 200

// TuneGC applies DefaultGCPercent unless getenv("GOGC") is set, in which
// case the runtime has already applied that; it reports whether it set
// the default.
func TuneGC(getenv func(string) string) bool {
	if getenv("GOGC") != "" {
		return false
	}
	debug.SetGCPercent(DefaultGCPercent)
	return true
}
