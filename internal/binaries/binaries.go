// Package binaries holds the configuration of each allot binary: the
// structs whose envconfig tags name the ALLOT_ variables it reads, and the
// variables a few tools read with os.Getenv. Each main uses its type here,
// so the deployment checks (deploy/) and docs/configuration.md's tables
// (internal/config) list a binary's variables by reflection instead of
// reading Go source.
//
// It imports the packages whose settings the binaries embed (config,
// ingest, allocator, notifier, audit, loadgen, bus); none of them may
// import it.
package binaries

import (
	"encoding"
	"os"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/notifier"
)

// Ingest is cmd/ingest's configuration.
type Ingest struct {
	config.Common
	ingest.Config
}

// Allocator is cmd/allocator's configuration.
type Allocator struct {
	config.Common
	allocator.Config
}

// Allotctl is cmd/allotctl's configuration (setup).
type Allotctl struct {
	config.Common
	bus.Config
}

// Audit is cmd/audit's configuration: audit.Config holds what its flags
// set and reads no variable.
type Audit struct {
	config.Common
	audit.Config
}

// Notifier is cmd/notifier's configuration.
type Notifier struct {
	config.Common
	notifier.Config
}

// IngestEnv and AllocatorEnv are the settings of the development stack's
// two parts, and SetupEnv its setup step's; named apart so all can be
// embedded (envconfig reads embedded structs' fields as the binary's own).
// ALLOT_PARTITIONS fills the three alike.
type (
	IngestEnv    = ingest.Config
	AllocatorEnv = allocator.Config
	SetupEnv     = bus.Config
)

// Stack is internal/cmd/stack's configuration.
type Stack struct {
	config.Common
	IngestEnv
	AllocatorEnv
	SetupEnv
	NATSPort  int           `envconfig:"EMBEDDED_NATS_PORT" default:"4233" desc:"port of the embedded NATS server (the machine's own NATS holds 4222)"`
	NATSStore string        `envconfig:"EMBEDDED_NATS_STORE" default:"var/nats" desc:"store directory of the embedded NATS server"`
	NATSSync  time.Duration `envconfig:"EMBEDDED_NATS_SYNC" default:"0s" desc:"fsync interval of the embedded server; 0 = always (every write on disk before its ack)"`
}

// StackGetenv is what internal/cmd/stack reads with os.Getenv, apart from
// Stack so that the effective configuration it prints stays Stack's.
type StackGetenv struct {
	PprofAddr string `envconfig:"PPROF_ADDR" desc:"serve Go's profiles here; empty = off"`
}

// Natsd is internal/cmd/natsd's configuration (flags override it).
type Natsd struct {
	Host  string        `envconfig:"EMBEDDED_NATS_HOST" default:"127.0.0.1" desc:"listen host"`
	Port  int           `envconfig:"EMBEDDED_NATS_PORT" default:"4233" desc:"client port; -1 or 0 picks a free one"`
	Store string        `envconfig:"EMBEDDED_NATS_STORE" default:"var/nats" desc:"JetStream store directory"`
	Sync  time.Duration `envconfig:"EMBEDDED_NATS_SYNC" default:"0s" desc:"fsync interval of the file store; 0 = always (every write on disk before its ack)"`

	Cluster     string `envconfig:"EMBEDDED_NATS_CLUSTER" desc:"cluster name; empty = a single server"`
	Name        string `envconfig:"EMBEDDED_NATS_NAME" desc:"this node's server name, unique in the cluster"`
	ClusterPort int    `envconfig:"EMBEDDED_NATS_CLUSTER_PORT" desc:"route port of this node"`
	Routes      string `envconfig:"EMBEDDED_NATS_ROUTES" desc:"comma-separated route URLs of the cluster's nodes"`
}

// Baseline is internal/cmd/baseline's configuration: allot's common
// settings plus the baseline's own.
type Baseline struct {
	config.Common
	RedisAddr string `envconfig:"REDIS_ADDR" default:"127.0.0.1:6379" desc:"Redis of the gated design"`
	// BaselineMaxConns is separate from ALLOT_MYSQL_MAX_CONNS on purpose:
	// the baselines keep the seed designs' 64-connection pool.
	BaselineMaxConns int `envconfig:"BASELINE_MYSQL_MAX_CONNS" default:"64" desc:"MySQL pool size of the baseline"`
}

// Loadgen is what cmd/loadgen reads with os.Getenv (Getenv fills it).
type Loadgen struct {
	HTTPAddr     string `envconfig:"HTTP_ADDR" desc:"the default -url's address (ingest's listen address)"`
	Token        string `envconfig:"TOKEN" desc:"bearer token when -token is not given"`
	AuthHS256Key string `envconfig:"AUTH_HS256_KEY" desc:"ingest's HS256 key: loadgen mints its own tokens"`
	AuthIssuer   string `envconfig:"AUTH_ISSUER" desc:"iss of the minted tokens"`
	AuthAudience string `envconfig:"AUTH_AUDIENCE" desc:"aud of the minted tokens"`
}

// Token is what internal/cmd/token reads with os.Getenv (Getenv fills it).
type Token struct {
	AuthHS256Key string `envconfig:"AUTH_HS256_KEY" desc:"ingest's HS256 key the token is signed with"`
	AuthIssuer   string `envconfig:"AUTH_ISSUER" desc:"iss of the token"`
	AuthAudience string `envconfig:"AUTH_AUDIENCE" desc:"aud of the token"`
}

// Bench is what internal/cmd/bench reads with os.Getenv (Getenv fills it).
type Bench struct {
	MySQLDSN string `envconfig:"MYSQL_DSN" desc:"the database the benchmark's stacks use"`
}

// Getenv fills the string fields of a T (one of Loadgen, Token, Bench,
// StackGetenv) with os.Getenv of ALLOT_ and their envconfig tag: exactly
// os.Getenv's reading, without envconfig's fallback to the unprefixed name.
func Getenv[T any]() T {
	var v T
	rv := reflect.ValueOf(&v).Elem()
	for i := range rv.NumField() {
		if name := rv.Type().Field(i).Tag.Get("envconfig"); name != "" {
			rv.Field(i).SetString(os.Getenv(config.Prefix + "_" + name))
		}
	}
	return v
}

// Binary is one allot binary: its directory and its configuration types.
type Binary struct {
	Name string // the command's name, the base of Dir
	Dir  string // cmd/ingest, internal/cmd/stack, …
	// Config holds a zero value of each type whose variables it reads.
	Config []any
}

// All lists the binaries that read ALLOT_ variables or that a deployment
// runs; binaries without variables (probe, devdb) have an empty Config.
var All = []Binary{
	{"ingest", "cmd/ingest", []any{Ingest{}}},
	{"allocator", "cmd/allocator", []any{Allocator{}}},
	{"audit", "cmd/audit", []any{Audit{}}},
	{"allotctl", "cmd/allotctl", []any{Allotctl{}}},
	{"notifier", "cmd/notifier", []any{Notifier{}}},
	{"loadgen", "cmd/loadgen", []any{Loadgen{}}},
	{"stack", "internal/cmd/stack", []any{Stack{}, StackGetenv{}}},
	{"natsd", "internal/cmd/natsd", []any{Natsd{}}},
	{"baseline", "internal/cmd/baseline", []any{Baseline{}}},
	{"token", "internal/cmd/token", []any{Token{}}},
	{"bench", "internal/cmd/bench", []any{Bench{}}},
	{"devdb", "internal/cmd/devdb", nil},
	{"probe", "internal/cmd/probe", nil},
}

// Var is one ALLOT_ variable a configuration type reads.
type Var struct {
	Name       string // ALLOT_…
	Type       reflect.Type
	Default    string
	HasDefault bool
}

// Vars lists the variables of the configuration structs in specs as
// envconfig names them: ALLOT_ and the envconfig tag, else the field's name
// upper-cased (split at word boundaries with split_words:"true");
// embedded structs are followed, unexported and ignored:"true" fields
// skipped. A name met twice keeps its first field, as config.Print does.
func Vars(specs ...any) []Var {
	var out []Var
	seen := map[string]bool{}
	for _, s := range specs {
		collect(reflect.TypeOf(s), config.Prefix+"_", seen, &out)
	}
	return out
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

func collect(t reflect.Type, prefix string, seen map[string]bool, out *[]Var) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Tag.Get("ignored") == "true" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		key := f.Tag.Get("envconfig")
		if key == "" {
			key = f.Name
			if f.Tag.Get("split_words") == "true" {
				key = strings.Join(splitWords(f.Name), "_")
			}
		}
		key = strings.ToUpper(key)
		if ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(textUnmarshaler) {
			inner := prefix
			if !f.Anonymous {
				inner = prefix + key + "_"
			}
			collect(ft, inner, seen, out)
			continue
		}
		name := prefix + key
		if seen[name] {
			continue
		}
		seen[name] = true
		def, ok := f.Tag.Lookup("default")
		*out = append(*out, Var{Name: name, Type: f.Type, Default: def, HasDefault: ok})
	}
}

// splitWords splits a field name as envconfig's split_words does:
// "MaxConns" → Max, Conns; "HTTPAddr" → HTTP, Addr.
func splitWords(s string) []string {
	var words []string
	for _, w := range gatherRegexp.FindAllStringSubmatch(s, -1) {
		if m := acronymRegexp.FindStringSubmatch(w[0]); len(m) == 3 {
			words = append(words, m[1], m[2])
		} else {
			words = append(words, w[0])
		}
	}
	if len(words) == 0 {
		return []string{s}
	}
	return words
}

// envconfig's own expressions.
var (
	gatherRegexp  = regexp.MustCompile("([^A-Z]+|[A-Z]+[^A-Z]+|[A-Z]+)")
	acronymRegexp = regexp.MustCompile("([A-Z]+)([A-Z][^A-Z]+)")
)
