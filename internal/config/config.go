// Package config holds the settings every allot binary shares, read from
// ALLOT_-prefixed environment variables, with validation and a masked
// printout of the effective values.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/tracing"
)

// Prefix is the environment variable prefix of every setting.
const Prefix = "ALLOT"

// Common is embedded in each binary's config struct.
type Common struct {
	NATSURL        string `envconfig:"NATS_URL" desc:"NATS server URL, may carry user:password@ (masked when printed); empty = the embedded server of make run"`
	NATSCreds      string `envconfig:"NATS_CREDS" desc:"NATS credentials file (JWT and nkey seed, as nsc writes it); empty = the URL's userinfo or none"`
	NATSNKey       string `envconfig:"NATS_NKEY_SEED_FILE" desc:"file holding this process's NATS nkey seed (nkey authentication)"`
	NATSTLSCA      string `envconfig:"NATS_TLS_CA" desc:"CA file that verifies the NATS server's certificate (tls:// URLs)"`
	NATSTLSCert    string `envconfig:"NATS_TLS_CERT" desc:"client certificate file for NATS mutual TLS"`
	NATSTLSKeyFile string `envconfig:"NATS_TLS_KEY_FILE" desc:"client key file for NATS mutual TLS"`
	MySQLDSN       string `envconfig:"MYSQL_DSN" default:"root@tcp(127.0.0.1:3306)/allot?parseTime=true" desc:"go-sql-driver DSN"`
	MySQLShards    string `envconfig:"MYSQL_SHARDS" desc:"several MySQL primaries, name=DSN,name=DSN (passwords masked when printed); empty = one shard, default, with ALLOT_MYSQL_DSN; the allocator applies each partition on its shard of the map and ingest reads it there, the audit and allotctl use ALLOT_MYSQL_DSN only"`
	MySQLMaxConns  int    `envconfig:"MYSQL_MAX_CONNS" default:"16" desc:"MySQL pool size per process"`
	LogLevel       string `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
}

// Validate reports the first invalid value as one sentence.
func (c Common) Validate() error {
	if c.MySQLMaxConns < 1 || c.MySQLMaxConns > 10_000 {
		return fmt.Errorf("ALLOT_MYSQL_MAX_CONNS must be between 1 and 10000, got %d", c.MySQLMaxConns)
	}
	cfg, err := mysql.ParseDSN(c.MySQLDSN)
	if err != nil {
		return fmt.Errorf("ALLOT_MYSQL_DSN is not a valid go-sql-driver DSN: %v", err)
	}
	if cfg.DBName == "" {
		return errors.New("ALLOT_MYSQL_DSN must name a database, e.g. root@tcp(127.0.0.1:3306)/allot")
	}
	if _, err := c.Shards(); err != nil {
		return err
	}
	if _, err := ParseLevel(c.LogLevel); err != nil {
		return err
	}
	if (c.NATSTLSCert == "") != (c.NATSTLSKeyFile == "") {
		return errors.New("ALLOT_NATS_TLS_CERT and ALLOT_NATS_TLS_KEY_FILE go together: set both or neither")
	}
	if c.NATSCreds != "" && c.NATSNKey != "" {
		return errors.New("ALLOT_NATS_CREDS and ALLOT_NATS_NKEY_SEED_FILE are two ways to authenticate: set one")
	}
	return nil
}

// Shards is the shard set of ALLOT_MYSQL_SHARDS (ALLOT_MYSQL_DSN as the one
// shard shards.DefaultName when it is empty). The allocator and ingest
// route by it.
func (c Common) Shards() (shards.Set, error) {
	return shards.Parse(c.MySQLShards, c.MySQLDSN)
}

// MaskShards hides the passwords of an ALLOT_MYSQL_SHARDS value.
func MaskShards(v string) string {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		if name, dsn, ok := strings.Cut(p, "="); ok {
			parts[i] = name + "=" + MaskDSN(dsn)
		} else {
			parts[i] = MaskDSN(p)
		}
	}
	return strings.Join(parts, ",")
}

// NATSOptions are the connection options of ALLOT_NATS_CREDS,
// ALLOT_NATS_NKEY_SEED_FILE and the TLS files. A user and password (or a
// token) in ALLOT_NATS_URL need none: nats.go reads them from the URL.
func (c Common) NATSOptions() ([]nats.Option, error) {
	var opts []nats.Option
	if c.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(c.NATSCreds))
	}
	if c.NATSNKey != "" {
		o, err := nats.NkeyOptionFromSeed(c.NATSNKey)
		if err != nil {
			return nil, fmt.Errorf("ALLOT_NATS_NKEY_SEED_FILE: %w", err)
		}
		opts = append(opts, o)
	}
	if c.NATSTLSCA != "" {
		opts = append(opts, nats.RootCAs(c.NATSTLSCA))
	}
	if c.NATSTLSCert != "" {
		opts = append(opts, nats.ClientCert(c.NATSTLSCert, c.NATSTLSKeyFile))
	}
	return opts, nil
}

// ConnectNATS connects to ALLOT_NATS_URL as the role name (bus.Connect:
// its inbox prefix, reconnects) with NATSOptions. A connection that fails
// says how to get a server.
func (c Common) ConnectNATS(name string, log *slog.Logger) (*nats.Conn, error) {
	opts, err := c.NATSOptions()
	if err != nil {
		return nil, err
	}
	nc, err := bus.Connect(c.NATSURL, name, log, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w — start NATS with JetStream or set ALLOT_NATS_URL", err)
	}
	return nc, nil
}

// MaskURL hides the password (or the token) in a URL's userinfo, and in
// each of a comma-separated list of URLs, as NATS URLs may be:
// nats://ingest:*****@host:4222, nats://*****@host:4222 for a token.
func MaskURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		scheme, rest, ok := strings.Cut(p, "://")
		if !ok {
			continue
		}
		// The last @: a password may hold @ or / (NATS URLs have no path).
		host := rest
		at := strings.LastIndex(host, "@")
		if at < 0 {
			continue
		}
		masked := "*****"
		if user, _, hasPass := strings.Cut(host[:at], ":"); hasPass {
			masked = user + ":*****"
		}
		parts[i] = scheme + "://" + masked + rest[at:]
	}
	return strings.Join(parts, ",")
}

// ParseLevel turns ALLOT_LOG_LEVEL into a slog level.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("ALLOT_LOG_LEVEL must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// Logger returns the JSON logger every binary logs with.
func (c Common) Logger(w io.Writer, binary string) *slog.Logger {
	level, _ := ParseLevel(c.LogLevel)
	var h slog.Handler = slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})
	if tracing.Configured() {
		h = tracing.LogHandler(h) // trace_id and span_id on a traced request's lines
	}
	return slog.New(h).With(slog.String("binary", binary))
}

// Load reads the environment into spec (a pointer to a struct embedding
// Common) and calls its Validate method.
func Load(spec interface{ Validate() error }) error {
	if err := envconfig.Process(Prefix, spec); err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	return spec.Validate()
}

// MaskDSN hides the password of a go-sql-driver DSN, also of one that
// does not parse (everything between the first ':' and the last '@' before
// the address).
func MaskDSN(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		at := strings.LastIndex(dsn, "@")
		if colon := strings.IndexByte(dsn, ':'); at > 0 && colon >= 0 && colon < at {
			return dsn[:colon+1] + "*****" + dsn[at:]
		}
		return dsn
	}
	if cfg.Passwd == "" {
		return dsn
	}
	cfg.Passwd = "*****"
	return cfg.FormatDSN()
}

// Print writes the effective configuration, one ALLOT_ variable a line, with
// secrets masked, so an operator sees what the process really runs with.
func Print(w io.Writer, binary string, spec any) {
	fmt.Fprintf(w, "%s: effective configuration\n", binary)
	printStruct(w, reflect.Indirect(reflect.ValueOf(spec)), map[string]bool{})
}

func printStruct(w io.Writer, v reflect.Value, seen map[string]bool) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f, fv := t.Field(i), v.Field(i)
		if f.Anonymous && fv.Kind() == reflect.Struct {
			printStruct(w, fv, seen)
			continue
		}
		name := f.Tag.Get("envconfig")
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		val := fmt.Sprint(fv.Interface())
		switch {
		case name == "MYSQL_DSN":
			val = MaskDSN(val)
		case name == "MYSQL_SHARDS":
			val = MaskShards(val)
		case strings.HasSuffix(name, "_URL"):
			val = MaskURL(val)
		case strings.Contains(name, "SECRET") || strings.Contains(name, "PASSWORD") || strings.HasSuffix(name, "_KEY"):
			if val != "" {
				val = "*****"
			}
		}
		if val == "" {
			val = `""`
		}
		fmt.Fprintf(w, "  %s_%s=%s\n", Prefix, name, val)
	}
}

// Fatal prints one line to stderr and exits with code 2: the fail-fast path
// for unreachable dependencies and invalid values.
func Fatal(binary string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
	os.Exit(2)
}

// ParseFlags parses a command's arguments into fs, which takes no
// positional arguments: the settings are ALLOT_ variables. -version prints
// the build (stdout) and exits 0. It returns -1
// when the command goes on, else the exit code: 0 after -h, 2 after a bad
// flag or a stray argument, said in one line on fs's output.
func ParseFlags(fs *flag.FlagSet, args []string) int {
	version := buildinfo.Flag(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q; the settings are %s_ environment variables\n", fs.Name(), fs.Arg(0), Prefix)
		return 2
	}
	if *version {
		buildinfo.Print(os.Stdout, fs.Name())
		return 0
	}
	return -1
}
