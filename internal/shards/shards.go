// Package shards names the MySQL primaries a partition's state may live on
// (ALLOT_MYSQL_SHARDS) and holds the partition → shard map kept in the KV
// bucket ALLOT_SHARDS, and routes a partition to its shard (Router): the
// allocator applies each partition there, ingest reads it there, the
// audit checks each shard's partitions there, and package move moves a
// partition to another shard; see docs/shards.md.
package shards

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// DefaultName is the name of the one shard of a deployment without
// ALLOT_MYSQL_SHARDS (its DSN is ALLOT_MYSQL_DSN). A single-database
// deployment that grows names its existing database so
// (ALLOT_MYSQL_SHARDS=default=<old DSN>,s1=...), and its map stays valid.
const DefaultName = "default"

// namePattern is what a shard name may be: lower case, a letter first, up
// to 32 characters, so it fits a log line, a metric label and a Vitess
// shard name alike.
var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// Shard is one named MySQL primary.
type Shard struct {
	Name string
	DSN  string
}

// Set is the configured shards, in the order ALLOT_MYSQL_SHARDS lists them.
type Set struct {
	shards []Shard
}

// Parse reads ALLOT_MYSQL_SHARDS (value) with ALLOT_MYSQL_DSN (dsn) as the
// one shard DefaultName when value is empty. Entries are name=DSN,
// separated by commas (a DSN in the list may not hold a comma). Each error
// is one sentence and never shows a password.
func Parse(value, dsn string) (Set, error) {
	if strings.TrimSpace(value) == "" {
		if _, err := mysql.ParseDSN(dsn); err != nil {
			return Set{}, fmt.Errorf("ALLOT_MYSQL_DSN is not a valid go-sql-driver DSN: %v", err)
		}
		return Set{shards: []Shard{{Name: DefaultName, DSN: dsn}}}, nil
	}
	var set Set
	seen := map[string]int{}
	for i, entry := range strings.Split(value, ",") {
		n := i + 1
		entry = strings.TrimSpace(entry)
		if entry == "" {
			return Set{}, fmt.Errorf("ALLOT_MYSQL_SHARDS entry %d is empty: write name=DSN,name=DSN", n)
		}
		name, d, ok := strings.Cut(entry, "=")
		if !ok || strings.ContainsAny(name, "@:/()") {
			return Set{}, fmt.Errorf("ALLOT_MYSQL_SHARDS entry %d is a DSN without a name: every entry is name=DSN (a single database goes in ALLOT_MYSQL_DSN)", n)
		}
		if !namePattern.MatchString(name) {
			return Set{}, fmt.Errorf("ALLOT_MYSQL_SHARDS entry %d has a bad name %q: a shard name is a lower-case letter then up to 31 of a-z, 0-9, _ and -", n, name)
		}
		if first, dup := seen[name]; dup {
			return Set{}, fmt.Errorf("ALLOT_MYSQL_SHARDS names shard %q twice (entries %d and %d)", name, first, n)
		}
		seen[name] = n
		cfg, err := mysql.ParseDSN(d)
		if err != nil {
			return Set{}, fmt.Errorf("ALLOT_MYSQL_SHARDS shard %q has a DSN that does not parse: %v", name, err)
		}
		if cfg.DBName == "" {
			return Set{}, fmt.Errorf("ALLOT_MYSQL_SHARDS shard %q has a DSN without a database, e.g. root@tcp(127.0.0.1:3306)/allot", name)
		}
		set.shards = append(set.shards, Shard{Name: name, DSN: d})
	}
	return set, nil
}

// Len is the number of shards.
func (s Set) Len() int { return len(s.shards) }

// Names are the shards' names in configured order.
func (s Set) Names() []string {
	out := make([]string, len(s.shards))
	for i, sh := range s.shards {
		out[i] = sh.Name
	}
	return out
}

// Shards are the shards in configured order.
func (s Set) Shards() []Shard { return append([]Shard(nil), s.shards...) }

// DSN is the DSN of shard name.
func (s Set) DSN(name string) (string, bool) {
	for _, sh := range s.shards {
		if sh.Name == name {
			return sh.DSN, true
		}
	}
	return "", false
}
