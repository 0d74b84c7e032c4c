// Package buildinfo says which build a binary is: its -version line and
// its allot_build_info metric, both from debug.ReadBuildInfo (the module
// version, the VCS revision when the build recorded one, the Go version).
package buildinfo

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Info is what the build recorded.
type Info struct {
	// Version is the main module's version: a tag for go install
	// module@version, "(devel)" for a build from a checkout.
	Version string
	// Revision is the VCS commit, with "+dirty" when the tree had changes;
	// "unknown" when the build recorded none (-buildvcs=false, no .git).
	Revision string
	// Time is the commit time, "" when unknown.
	Time string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// version and revision, when set at link time (-ldflags -X, as
// deploy/Dockerfile does from its build arguments), win over what
// debug.ReadBuildInfo says: an image is built without .git.
var version, revision string

// Read returns the running binary's build information.
func Read() Info {
	in := fromBuild()
	if version != "" {
		in.Version = version
	}
	if revision != "" {
		in.Revision = revision
	}
	return in
}

// fromBuild is Read without the link-time values.
func fromBuild() Info {
	in := Info{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return in
	}
	if bi.Main.Version != "" {
		in.Version = bi.Main.Version
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && in.Revision != "unknown" {
		in.Revision += "+dirty"
	}
	return in
}

// String is the -version line of binary.
func (in Info) String() string {
	s := fmt.Sprintf("%s, revision %s", in.Version, in.Revision)
	if in.Time != "" {
		s += " of " + in.Time
	}
	return s + ", " + in.GoVersion
}

// Print writes binary's -version line to w.
func Print(w io.Writer, binary string) {
	fmt.Fprintf(w, "%s %s\n", binary, Read())
}

// Flag registers -version on fs; after fs.Parse, a true value means: Print
// and exit 0.
func Flag(fs *flag.FlagSet) *bool {
	return fs.Bool("version", false, "print the version and exit")
}

// MetricName is the name of the build metric.
const MetricName = "allot_build_info"

// Collector is the allot_build_info gauge: always 1, with the build in its
// labels, so a dashboard can show which version each instance runs.
func Collector() prometheus.Collector {
	in := Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricName,
		Help: "The running build: version, revision and goversion in the labels; always 1.",
		ConstLabels: prometheus.Labels{
			"version": in.Version, "revision": in.Revision, "goversion": in.GoVersion,
		},
	})
	g.Set(1)
	return g
}
