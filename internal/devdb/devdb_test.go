package devdb

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/testenv"
)

func TestDecide(t *testing.T) {
	tests := []struct {
		name string
		s    Situation
		want Action
	}{
		{"the DSN's server answers", Situation{DSN: Answers, Server: "/usr/sbin/mariadbd", Private: Answers}, UseDSN},
		{"the user's DSN refuses the login", Situation{DSN: Refused, Explicit: true, Server: "/usr/sbin/mariadbd"}, Fail},
		{"the default DSN refuses (Debian's unix_socket root)", Situation{DSN: Refused, Server: "/usr/sbin/mariadbd"}, StartPrivate},
		{"a private server is already running", Situation{DSN: Unreachable, Private: Answers, Server: "/usr/sbin/mariadbd"}, ReusePrivate},
		{"the user's DSN is unreachable, mariadbd installed", Situation{DSN: Unreachable, Explicit: true, Server: "/usr/sbin/mariadbd"}, StartPrivate},
		{"nothing installed, root on Debian", Situation{GOOS: "linux", Apt: true, Root: true, MayInstall: true}, Install},
		{"nothing installed, root on Debian, installing not allowed", Situation{GOOS: "linux", Apt: true, Root: true}, Advise},
		{"nothing installed, not root on Debian", Situation{GOOS: "linux", Apt: true, MayInstall: true}, Advise},
		{"nothing installed, root on another Linux", Situation{GOOS: "linux", Root: true, MayInstall: true}, Advise},
		{"nothing installed, macOS", Situation{GOOS: "darwin", MayInstall: true}, Advise},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Decide(tt.s); got != tt.want {
				t.Errorf("Decide(%+v) = %v, want %v", tt.s, got, tt.want)
			}
		})
	}
}

func TestAdviceNamesThePlatformsCommand(t *testing.T) {
	tests := []struct {
		name string
		s    Situation
		want string
	}{
		{"macOS", Situation{GOOS: "darwin"}, "brew install mariadb"},
		{"Debian as a user", Situation{GOOS: "linux", Apt: true}, "sudo apt-get install mariadb-server"},
		{"Debian as root", Situation{GOOS: "linux", Apt: true, Root: true}, "apt-get install mariadb-server"},
		{"another Linux", Situation{GOOS: "linux"}, "dnf install mariadb-server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Advice(tt.s)
			if !strings.Contains(got, tt.want) || !strings.Contains(got, "docker compose -f deploy/compose.yaml up") {
				t.Errorf("Advice = %q, want it to name %q and the compose fallback", got, tt.want)
			}
			if strings.Contains(got, "\n") {
				t.Errorf("Advice is more than one line: %q", got)
			}
		})
	}
}

// TestEnsureAdvisesWhenNothingIsInstalled: no server answers, none is
// installed, installing is not allowed: one line naming the command.
func TestEnsureAdvisesWhenNothingIsInstalled(t *testing.T) {
	_, err := Ensure(context.Background(), Options{DSN: testenv.DeadDSN(t, "allot_x"), Dir: t.TempDir(), Server: "none"})
	if err == nil || !strings.Contains(err.Error(), "install") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Ensure = %v, want one line naming an install command", err)
	}
}

// TestEnsureUsesTheDSNThatAnswers: the tests' own server answers, so
// Ensure hands back the DSN unchanged and starts nothing.
func TestEnsureUsesTheDSNThatAnswers(t *testing.T) {
	dsn := os.Getenv("ALLOT_TEST_MYSQL_DSN")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/?parseTime=true"
	}
	if p, err := ProbeDSN(context.Background(), dsn); p != Answers {
		testenv.Missing(t, fmt.Sprintf("the tests' server at %s does not answer: %v", dsn, err))
	}
	db, err := Ensure(context.Background(), Options{DSN: dsn, Dir: t.TempDir(), Server: "none"})
	if err != nil {
		t.Fatal(err)
	}
	if db.DSN != dsn || db.Action != UseDSN || db.Owned() {
		t.Fatalf("got %+v, want the DSN unchanged and nothing started", db)
	}
}

// TestEnsureStartsAPrivateServer starts the installed mariadbd/mysqld with
// its data in a temporary directory, reuses it from a second Ensure, and
// stops it; the second start reuses the initialised data.
func TestEnsureStartsAPrivateServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a database server")
	}
	server := findServer("")
	if server == "" {
		testenv.Missing(t, "no mariadbd or mysqld installed")
	}
	dir := filepath.Join(t.TempDir(), "mysql")
	want := testenv.DeadDSN(t, "allot_x")
	var log bytes.Buffer
	db, err := Ensure(context.Background(), Options{DSN: want, Explicit: true, Dir: dir, Log: &log})
	if err != nil {
		t.Fatalf("Ensure: %v; log: %s", err, log.String())
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			db.Stop() //nolint:errcheck // cleanup after a failure
		}
	})
	if db.Action != StartPrivate || !db.Owned() {
		t.Fatalf("action %v, owned %v; want a private server started", db.Action, db.Owned())
	}
	got, _ := mysql.ParseDSN(db.DSN)
	orig, _ := mysql.ParseDSN(want)
	if got.DBName != orig.DBName || got.Addr == orig.Addr || !got.ParseTime {
		t.Fatalf("DSN %s: want database %s and parseTime kept, the address moved", db.DSN, orig.DBName)
	}
	if p, err := ProbeDSN(context.Background(), db.DSN); p != Answers {
		t.Fatalf("the private server does not answer: %v", err)
	}

	// A second command (make test beside make run) reuses it.
	again, err := Ensure(context.Background(), Options{DSN: want, Dir: dir, Server: "none"})
	if err != nil {
		t.Fatal(err)
	}
	if again.Action != ReusePrivate || again.Owned() || again.DSN != db.DSN {
		t.Fatalf("second Ensure: %v owned=%v %s; want the running server reused", again.Action, again.Owned(), again.DSN)
	}
	if err := again.Stop(); err != nil {
		t.Fatal(err)
	}
	if p, _ := ProbeDSN(context.Background(), db.DSN); p != Answers {
		t.Fatal("Stop of a reused server stopped it")
	}

	if err := db.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if p, _ := ProbeDSN(context.Background(), db.DSN); p == Answers {
		t.Fatal("the private server still answers after Stop")
	}
	if _, err := os.Stat(filepath.Join(dir, "port")); !os.IsNotExist(err) {
		t.Fatalf("the port file outlives the server: %v", err)
	}

	// Started again on the initialised data: no second initialisation.
	log.Reset()
	db2, err := Ensure(context.Background(), Options{DSN: want, Dir: dir, Log: &log})
	if err != nil {
		t.Fatalf("restart: %v; log: %s", err, log.String())
	}
	defer db2.Stop() //nolint:errcheck // cleanup
	if strings.Contains(log.String(), "initialising") {
		t.Errorf("the data directory was initialised twice: %s", log.String())
	}
}

// TestInitDataDirTriesACrashedBootstrapAgain: a bootstrap that fails is
// run again on a fresh directory (nothing the failed one left behind),
// up to three times, and the error of the last says which try it was.
func TestInitDataDirTriesACrashedBootstrapAgain(t *testing.T) {
	dir := t.TempDir()
	// The installer fails until its count reaches $FAKE_OK_AT; each run
	// leaves a file in the data directory, and a later run fails if it
	// finds one.
	script := `#!/bin/sh
n=$(cat "$FAKE_COUNT" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$FAKE_COUNT"
for a; do case $a in --datadir=*) data=${a#--datadir=};; esac; done
[ -e "$data/left-behind" ] && { echo "not a fresh directory"; exit 1; }
mkdir -p "$data" && touch "$data/left-behind"
[ $n -ge "$FAKE_OK_AT" ] || { echo "got signal 11"; exit 1; }
mkdir -p "$data/mysql"
`
	if err := os.WriteFile(filepath.Join(dir, "mariadb-install-db"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	server := filepath.Join(dir, "mariadbd") // named so: never run here
	for _, c := range []struct {
		okAt    string
		wantErr string
		runs    string
	}{{"2", "", "2"}, {"4", "try 3 of 3", "3"}} {
		count := filepath.Join(dir, "count-"+c.okAt)
		t.Setenv("FAKE_COUNT", count)
		t.Setenv("FAKE_OK_AT", c.okAt)
		data := filepath.Join(dir, "data-"+c.okAt)
		err := InitDataDir(context.Background(), server, data)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("ok at run %s: %v", c.okAt, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("ok at run %s: err %v, want one saying %q", c.okAt, err, c.wantErr)
		}
		if b, _ := os.ReadFile(count); strings.TrimSpace(string(b)) != c.runs {
			t.Errorf("ok at run %s: the installer ran %q times, want %s", c.okAt, strings.TrimSpace(string(b)), c.runs)
		}
	}
}
