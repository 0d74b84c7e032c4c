package shards_test

import (
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/shards"
)

const dsn = "root@tcp(127.0.0.1:3306)/allot?parseTime=true"

func TestParseEmptyIsOneDefaultShard(t *testing.T) {
	set, err := shards.Parse("", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Names(); len(got) != 1 || got[0] != shards.DefaultName {
		t.Fatalf("names %v, want [%s]", got, shards.DefaultName)
	}
	if d, ok := set.DSN(shards.DefaultName); !ok || d != dsn {
		t.Fatalf("DSN %q %v, want ALLOT_MYSQL_DSN", d, ok)
	}
}

func TestParseList(t *testing.T) {
	set, err := shards.Parse("s0=root@tcp(a:3306)/allot, s1=u:p@tcp(b:3306)/allot?parseTime=true", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(set.Names(), ","); got != "s0,s1" {
		t.Fatalf("names %s", got)
	}
	if d, _ := set.DSN("s1"); d != "u:p@tcp(b:3306)/allot?parseTime=true" {
		t.Fatalf("s1 DSN %q", d)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ value, want string }{
		{"a=root@tcp(a)/x,a=root@tcp(b)/x", `names shard "a" twice`},
		{"A=root@tcp(a)/x", `bad name "A"`},
		{"1a=root@tcp(a)/x", `bad name "1a"`},
		{"a=root@tcp(a)/x?parseTime=maybe", `shard "a" has a DSN that does not parse`},
		{"a=root@tcp(a)/", `shard "a" has a DSN without a database`},
		{"a=root@tcp(a)/x,root@tcp(b)/x", "entry 2 is a DSN without a name"},
		{"root:pw@tcp(b)/x?parseTime=true", "entry 1 is a DSN without a name"},
		{"a=root@tcp(a)/x,", "entry 2 is empty"},
	} {
		_, err := shards.Parse(c.value, dsn)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", c.value, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "pw") || strings.Contains(err.Error(), "\n") {
			t.Errorf("Parse(%q): %q shows a password or is not one line", c.value, err)
		}
	}
	if _, err := shards.Parse("", "not a dsn"); err == nil || !strings.Contains(err.Error(), "ALLOT_MYSQL_DSN") {
		t.Errorf("a bad ALLOT_MYSQL_DSN: %v", err)
	}
}
