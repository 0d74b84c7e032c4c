package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/store"
)

// startMariaDB runs a MariaDB server of the test's own: a fresh data
// directory, a free port, root without a password over TCP. It returns the
// server's process and a DSN for it (no database named).
func startMariaDB(t *testing.T) (*proc, string) {
	t.Helper()
	install, err := exec.LookPath("mariadb-install-db")
	if err != nil {
		t.Skip("mariadb-install-db is not installed: this scenario needs its own MariaDB server")
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	out, err := exec.Command(install, "--no-defaults", "--datadir="+data, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--user="+currentUser()).CombinedOutput()
	if err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	port := freePort(t)
	p := newProc(t, "mariadb", "/usr/sbin/mariadbd", nil, "--no-defaults", "--datadir="+data,
		fmt.Sprintf("--port=%d", port), "--bind-address=127.0.0.1", "--socket="+filepath.Join(dir, "sock"),
		"--user="+currentUser(), "--skip-name-resolve", "--skip-log-bin", "--innodb-buffer-pool-size=64M")
	dsn := fmt.Sprintf("root@tcp(127.0.0.1:%d)/?parseTime=true", port)
	if err := startAndWait(p, dsn); err != nil {
		t.Fatal(err)
	}
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
			return fmt.Errorf("mariadbd exited: %s", p.current().output.String())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mariadbd not answering after 30s: %v", err)
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
