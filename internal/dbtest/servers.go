package dbtest

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/allot-dev/allot/internal/devdb"
	"github.com/allot-dev/allot/internal/testenv"
)

// Servers starts n private MySQL-compatible servers for t (devdb's
// private server: the installed mariadbd or mysqld, a fresh data
// directory under t's temporary directory, a free port, root without a
// password) and returns a base DSN for each, no database named (NewOn
// makes one). They are stopped when the test ends. Without a server
// binary the test is skipped (failed on CI).
func Servers(t testing.TB, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i, s := range ServerProcs(t, n) {
		out[i] = s.DSN
	}
	return out
}

// ServerProcs is Servers with the servers themselves, which a test may
// Kill (SIGKILL) and Restart (same data, same port).
func ServerProcs(t testing.TB, n int) []*devdb.DB {
	t.Helper()
	if devdb.FindServer() == "" {
		testenv.Missing(t, "neither mariadbd nor mysqld is installed: this test runs servers of its own (apt-get install mariadb-server)")
	}
	dir := t.TempDir()
	out := make([]*devdb.DB, n)
	for i := range n {
		// A server that fails to start on a loaded machine (seldom, and
		// saying little why) gets a second try in a fresh directory.
		var db *devdb.DB
		var err error
		for try := range 2 {
			db, err = devdb.StartServer(context.Background(), filepath.Join(dir, fmt.Sprintf("s%d-%d", i, try)), DefaultDSN, nil)
			if err == nil {
				break
			}
			t.Logf("dbtest: start server %d of %d (try %d of 2): %v", i+1, n, try+1, err)
		}
		if err != nil {
			t.Fatalf("dbtest: start server %d of %d: %v", i+1, n, err)
		}
		t.Cleanup(func() {
			if err := db.Stop(); err != nil {
				t.Errorf("dbtest: stop server %d: %v; the end of its log: %s", i+1, err, db.LogTail(20))
			}
		})
		out[i] = db
	}
	return out
}
