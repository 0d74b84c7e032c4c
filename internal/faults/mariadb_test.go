package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/devdb"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
)

// dbServer is a database server binary the suite can run a private
// instance of: MariaDB (mariadbd, data directory made by
// mariadb-install-db) or MySQL 8 (mysqld --initialize-insecure).
type dbServer struct {
	kind   string // "mariadb" or "mysql"
	daemon string
}

// findDBServer looks for MariaDB first, then MySQL. $ALLOT_FAULTS_MYSQLD
// names a server binary to use instead (its --version tells the kind).
func findDBServer() (dbServer, error) {
	look := func(names ...string) string {
		for _, n := range names {
			if p, err := exec.LookPath(n); err == nil {
				return p
			}
			for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin"} {
				p := filepath.Join(dir, n)
				if st, err := os.Stat(p); err == nil && !st.IsDir() {
					return p
				}
			}
		}
		return ""
	}
	daemon := os.Getenv("ALLOT_FAULTS_MYSQLD")
	if daemon == "" {
		daemon = look("mariadbd", "mysqld")
	}
	if daemon == "" {
		return dbServer{}, errors.New("neither mariadbd nor mysqld is installed: scenario 9 runs a database server of its own (apt-get install mariadb-server)")
	}
	out, err := exec.Command(daemon, "--version").CombinedOutput()
	if err != nil {
		return dbServer{}, fmt.Errorf("%s --version: %w: %s", daemon, err, out)
	}
	if !strings.Contains(strings.ToLower(string(out)), "mariadb") {
		return dbServer{kind: "mysql", daemon: daemon}, nil
	}
	if look("mariadb-install-db", "mysql_install_db") == "" {
		return dbServer{}, errors.New("mariadb-install-db is not installed: scenario 9 needs it to make its MariaDB server's data directory")
	}
	return dbServer{kind: "mariadb", daemon: daemon}, nil
}

// initialize makes a fresh data directory with root and no password, as
// devdb does for its private server: a bootstrap that crashes (MariaDB's
// has, now and then, on a loaded machine) is tried again on a fresh
// directory, up to three times.
func (d dbServer) initialize(data string) error {
	return devdb.InitDataDir(context.Background(), d.daemon, data)
}

// args are the server's arguments for a private instance on port.
func (d dbServer) args(dir, data string, port int) []string {
	args := []string{"--no-defaults", "--datadir=" + data,
		fmt.Sprintf("--port=%d", port), "--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "sock"),
		"--pid-file=" + filepath.Join(dir, "pid"),
		"--user=" + currentUser(), "--skip-log-bin", "--innodb-buffer-pool-size=64M"}
	if d.kind == "mysql" {
		// MySQL 8's root is root@localhost: TCP from 127.0.0.1 matches it
		// only with name resolution on. The X protocol would take the
		// fixed port 33060, which the shared server may hold.
		return append(args, "--mysqlx=OFF")
	}
	return append(args, "--skip-name-resolve")
}

// startMariaDB runs a database server of the test's own (MariaDB, or MySQL
// 8): a fresh data directory, a free port, root without a password over
// TCP. It returns the server's process and a DSN for it (no database
// named). Without a server binary it skips, or fails on CI.
func startMariaDB(t *testing.T) (*proc, string) {
	t.Helper()
	srv, err := findDBServer()
	if err != nil {
		testenv.Missing(t, err.Error())
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := srv.initialize(data); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	p := newProc(t, srv.kind, srv.daemon, nil, srv.args(dir, data, port)...)
	dsn := fmt.Sprintf("root@tcp(127.0.0.1:%d)/?parseTime=true", port)
	if err := startAndWait(p, dsn); err != nil {
		t.Fatal(err)
	}
	t.Logf("private %s server: %s on port %d", srv.kind, srv.daemon, port)
	return p, dsn
}

// startAndWait starts a new incarnation of the server and waits until it
// answers.
func startAndWait(p *proc, dsn string) error {
	if _, err := p.start(); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		db, err := store.Open(ctx, dsn, 1)
		cancel()
		if err == nil {
			db.Close()
			return nil
		}
		if !p.alive() {
			return fmt.Errorf("%s exited: %s", p.name, p.current().output.String())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering after 30s: %v", p.name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func currentUser() string {
	if os.Geteuid() == 0 {
		return "root"
	}
	return os.Getenv("USER")
}
