// Command devdb runs a command with a MySQL-compatible server answering:
// the one its DSN variable names if it answers, else a private server from
// the installed mariadbd/mysqld with its data under var/mysql (started on a
// free port, stopped when the command ends), else, as root on Debian or
// Ubuntu, mariadb-server installed with apt-get. The command gets the DSN
// variable pointed at the server chosen. `make run`, `make test`,
// `make reset` and `.ci/run` go through it:
//
//	devdb -var ALLOT_MYSQL_DSN -- ./bin/stack
//	devdb -var ALLOT_TEST_MYSQL_DSN -- go test ./...
//	devdb -reset -- ./bin/stack -reset   # and delete var/mysql afterwards
//
// Exit code: the command's; 2 when no server could be had (said in one
// line, naming the command that installs one).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/allot-dev/allot/internal/devdb"
)

const binary = "devdb"

// defaults are the DSNs used when their variable is unset: the binaries'
// (internal/config) and the tests' (internal/dbtest).
var defaults = map[string]string{
	"ALLOT_MYSQL_DSN":      "root@tcp(127.0.0.1:3306)/allot?parseTime=true",
	"ALLOT_TEST_MYSQL_DSN": "root@tcp(127.0.0.1:3306)/?parseTime=true",
}

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(binary, flag.ContinueOnError)
	fs.SetOutput(stderr)
	variable := fs.String("var", "ALLOT_MYSQL_DSN", "the DSN variable to check and to hand to the command")
	dir := fs.String("dir", "var/mysql", "directory of the private server")
	server := fs.String("server", "", `mariadbd or mysqld to start; "" searches PATH and the sbin directories, "none" pretends none is installed`)
	install := fs.Bool("install", true, "as root on Debian/Ubuntu, install mariadb-server when no server is installed")
	reset := fs.Bool("reset", false, "after the command succeeds, stop the private server and delete its directory (make reset)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintf(stderr, "%s: usage: devdb [flags] -- command [args]\n", binary)
		return 2
	}
	def, ok := defaults[*variable]
	if !ok {
		fmt.Fprintf(stderr, "%s: -var must be ALLOT_MYSQL_DSN or ALLOT_TEST_MYSQL_DSN, got %q\n", binary, *variable)
		return 2
	}
	dsn, explicit := os.Getenv(*variable), true
	if dsn == "" {
		dsn, explicit = def, false
	}

	// A signal to stop is passed on to the command (which may get Ctrl-C
	// from the terminal too: a second interrupt is harmless to a
	// signal.NotifyContext); this process waits for it to finish, then
	// stops the server, which sits in a process group of its own.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)

	ctx := context.Background()
	db, err := devdb.Ensure(ctx, devdb.Options{
		DSN: dsn, Explicit: explicit, Dir: *dir, Server: *server,
		MayInstall: *install && !*reset, Log: stderr,
	})
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	if *reset && !db.Owned() && db.Action == devdb.ReusePrivate {
		fmt.Fprintf(stderr, "%s: a private server is running from %s (a make run?); stop it first, then reset\n", binary, *dir)
		return 2
	}

	select {
	case <-sigs: // stopped while the server started
		_ = db.Stop()
		return 130
	default:
	}

	cmd := exec.Command(fs.Arg(0), fs.Args()[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, stderr
	cmd.Env = append(os.Environ(), *variable+"="+db.DSN)
	code := 0
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		code = 2
	} else {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
	wait:
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case err := <-done:
				code = exitCode(err)
				break wait
			}
		}
	}
	if err := db.Stop(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
	}
	if *reset && code == 0 {
		abs, _ := filepath.Abs(*dir)
		if err := os.RemoveAll(abs); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", binary, err)
			return 1
		}
		fmt.Fprintf(stderr, "%s: deleted the private server's data %s\n", binary, abs)
	}
	return code
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() >= 0 {
		return ee.ExitCode()
	}
	return 1
}
