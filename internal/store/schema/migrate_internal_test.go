package schema

import (
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// TestAlreadyThere: the errors a re-run of a migration meets on MariaDB and
// on MySQL 8 (which this machine does not have, hence the codes) are
// tolerated; anything else is not.
func TestAlreadyThere(t *testing.T) {
	for _, c := range []struct {
		code uint16
		want bool
	}{
		{1060, true}, {1061, true}, {1091, true}, // duplicate column, key; can't drop
		{1826, true}, {3822, true}, // duplicate constraint: MariaDB, MySQL
		{3821, true}, {3940, true}, // MySQL: no such check constraint, no such constraint
		{1146, false}, {1064, false}, {3819, false}, // no table, syntax, check violated
	} {
		if got := alreadyThere(&mysql.MySQLError{Number: c.code}); got != c.want {
			t.Errorf("alreadyThere(%d) = %v, want %v", c.code, got, c.want)
		}
	}
	if alreadyThere(errors.New("connection refused")) {
		t.Error("a non-MySQL error taken for a re-run")
	}
}
