package devdb

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Options says where to look and what Ensure may do.
type Options struct {
	// DSN is the configured server's go-sql-driver DSN.
	DSN string
	// Explicit is true when the user set DSN (see Situation.Explicit).
	Explicit bool
	// Dir holds the private server: data/, its socket, pid, log and port.
	Dir string
	// Server is the mariadbd or mysqld to start; "" searches PATH and the
	// usual sbin directories, "none" pretends none is installed.
	Server string
	// MayInstall allows apt-get install mariadb-server as root on Debian.
	MayInstall bool
	// Port is the private server's port; 0 picks a free one.
	Port int
	// Log receives one line per thing done (a server started, a package
	// installed), so a user sees what happened to their machine.
	Log io.Writer
}

// DB is the server Ensure settled on.
type DB struct {
	// DSN is Options.DSN pointed at the chosen server: the same database
	// name and parameters, the private server's address and user root.
	DSN string
	// Action is what Ensure did.
	Action Action

	cmd    *exec.Cmd
	exited chan struct{} // closed when the server process has exited
	dir    string
	log    io.Writer
}

// Ensure makes sure a server answers and returns it. When it started a
// private server, Stop stops it.
func Ensure(ctx context.Context, o Options) (*DB, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Dir == "" {
		o.Dir = "var/mysql"
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	o.Dir = dir
	if _, err := mysql.ParseDSN(o.DSN); err != nil {
		return nil, fmt.Errorf("the DSN is not a go-sql-driver DSN: %w", err)
	}
	s, privateDSN, dsnErr := look(ctx, o)
	for installed := false; ; {
		switch a := Decide(s); a {
		case UseDSN:
			return &DB{DSN: o.DSN, Action: a}, nil
		case Fail:
			return nil, fmt.Errorf("the server of ALLOT_MYSQL_DSN / ALLOT_TEST_MYSQL_DSN answers but refuses: %v", dsnErr)
		case ReusePrivate:
			fmt.Fprintf(o.Log, "devdb: using the private server already running from %s (%s)\n", o.Dir, why(s, dsnErr))
			return &DB{DSN: privateDSN, Action: a}, nil
		case StartPrivate:
			fmt.Fprintf(o.Log, "devdb: starting a private server from %s with its data under %s (%s)\n", s.Server, o.Dir, why(s, dsnErr))
			db, err := startPrivate(ctx, s.Server, o)
			if err != nil {
				return nil, err
			}
			return db, nil
		case Install:
			if installed {
				return nil, errors.New("mariadb-server was installed but no mariadbd was found afterwards")
			}
			installed = true
			fmt.Fprintf(o.Log, "devdb: no MySQL-compatible server answers or is installed; installing mariadb-server with apt-get (running as root on Debian/Ubuntu)\n")
			if err := aptInstall(ctx, o.Log); err != nil {
				return nil, fmt.Errorf("apt-get install mariadb-server: %w", err)
			}
			s, privateDSN, dsnErr = look(ctx, o)
			s.MayInstall = false
		default:
			return nil, errors.New(Advice(s))
		}
	}
}

func why(s Situation, dsnErr error) string {
	if s.DSN == Refused {
		return fmt.Sprintf("the default server refuses root without a password: %v", dsnErr)
	}
	return fmt.Sprintf("nothing answers at the DSN's address: %v", dsnErr)
}

// look gathers the Situation, and the DSN of a running private server.
func look(ctx context.Context, o Options) (Situation, string, error) {
	s := Situation{
		Explicit:   o.Explicit,
		GOOS:       runtime.GOOS,
		Root:       os.Geteuid() == 0,
		MayInstall: o.MayInstall,
	}
	_, aptErr := exec.LookPath("apt-get")
	s.Apt = aptErr == nil
	var dsnErr error
	s.DSN, dsnErr = ProbeDSN(ctx, o.DSN)
	var privateDSN string
	if port, err := os.ReadFile(filepath.Join(o.Dir, "port")); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(port))); err == nil {
			privateDSN = pointAt(o.DSN, p)
			s.Private, _ = ProbeDSN(ctx, privateDSN)
		}
	}
	s.Server = findServer(o.Server)
	return s, privateDSN, dsnErr
}

// ProbeDSN connects to the server of dsn (without its database, which may
// not exist yet) and runs a query.
func ProbeDSN(ctx context.Context, dsn string) (Probe, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return Unreachable, err
	}
	cfg.DBName = ""
	cfg.Timeout = 2 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return Unreachable, err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var one int
	err = db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return Answers, nil
	case errors.As(err, &me):
		return Refused, err
	default:
		return Unreachable, err
	}
}

// pointAt returns dsn with its address moved to the private server on
// port: same database and parameters, user root without a password (the
// private server is initialised so).
func pointAt(dsn string, port int) string {
	cfg, _ := mysql.ParseDSN(dsn)
	cfg.Net = "tcp"
	cfg.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg.User = "root"
	cfg.Passwd = ""
	return cfg.FormatDSN()
}

// serverDirs are searched after PATH: Debian's /usr/sbin is not on a
// normal user's PATH.
var serverDirs = []string{"/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin", "/opt/homebrew/bin", "/usr/local/bin"}

// FindServer returns the path of the installed mariadbd or mysqld that
// Ensure would start, "" if none is installed.
func FindServer() string { return findServer("") }

func findServer(override string) string {
	switch override {
	case "none":
		return ""
	case "":
	default:
		if p, err := exec.LookPath(override); err == nil {
			return p
		}
		return ""
	}
	for _, name := range []string{"mariadbd", "mysqld"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		for _, d := range serverDirs {
			p := filepath.Join(d, name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				return p
			}
		}
	}
	return ""
}

func aptInstall(ctx context.Context, log io.Writer) error {
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "mariadb-server"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%w: %s", err, lastLines(out.String(), 5))
		}
	}
	fmt.Fprintln(log, "devdb: installed mariadb-server")
	return nil
}

// isMariaDB tells MariaDB's server from MySQL's: they initialise a data
// directory differently.
func isMariaDB(server string) bool {
	if strings.Contains(filepath.Base(server), "mariadb") {
		return true
	}
	out, _ := exec.Command(server, "--version").CombinedOutput()
	return bytes.Contains(bytes.ToLower(out), []byte("mariadb"))
}

// InitDataDir creates a data directory for server (mariadbd or mysqld) at
// data, as a private server's first use does: root without a password,
// reachable over TCP from 127.0.0.1. A bootstrap that fails is tried
// again on a fresh directory, up to three times.
func InitDataDir(ctx context.Context, server, data string) error {
	return initialise(ctx, server, data, os.Geteuid() == 0)
}

// initialise creates the data directory on first use: root without a
// password, reachable over TCP from 127.0.0.1, like the DSN's default.
func initialise(ctx context.Context, server, data string, root bool) error {
	var cmd *exec.Cmd
	if isMariaDB(server) {
		installDB := ""
		for _, name := range []string{"mariadb-install-db", "mysql_install_db"} {
			if p, err := exec.LookPath(name); err == nil {
				installDB = p
				break
			}
			if p := filepath.Join(filepath.Dir(server), name); fileExists(p) {
				installDB = p
				break
			}
			if p := filepath.Join("/usr/bin", name); fileExists(p) {
				installDB = p
				break
			}
		}
		if installDB == "" {
			return errors.New("mariadb-install-db is not installed (it comes with mariadb-server)")
		}
		args := []string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"}
		if root {
			args = append(args, "--user=root")
		}
		cmd = exec.CommandContext(ctx, installDB, args...)
	} else {
		args := []string{"--no-defaults", "--initialize-insecure", "--datadir=" + data}
		if root {
			args = append(args, "--user=root")
		}
		cmd = exec.CommandContext(ctx, server, args...)
	}
	// The bootstrap now and then fails on a busy machine with nothing but
	// its boilerplate to say why; a fresh directory and a second or third
	// try succeed.
	var err error
	for try := 1; try <= 3; try++ {
		var out []byte
		c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
		if out, err = c.CombinedOutput(); err == nil {
			return nil
		}
		os.RemoveAll(data)
		err = fmt.Errorf("initialise %s (try %d of 3): %w: %s", data, try, err, lastLines(string(out), 5))
		if ctx.Err() != nil {
			break
		}
	}
	return err
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// startPrivate starts server on a free port with its data under o.Dir,
// initialising the data directory on first use, and waits until it answers.
func startPrivate(ctx context.Context, server string, o Options) (*DB, error) {
	data := filepath.Join(o.Dir, "data")
	root := os.Geteuid() == 0
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	if !fileExists(filepath.Join(data, "mysql")) {
		fmt.Fprintf(o.Log, "devdb: initialising %s (first use)\n", data)
		if err := initialise(ctx, server, data, root); err != nil {
			return nil, err
		}
	}
	port := o.Port
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	socket := filepath.Join(o.Dir, "mysqld.sock")
	if len(socket) > 100 { // sun_path holds 108 bytes
		socket = filepath.Join(os.TempDir(), fmt.Sprintf("allot-mysqld-%d.sock", port))
	}
	args := []string{"--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket=" + socket, "--pid-file=" + filepath.Join(o.Dir, "mysqld.pid"),
		"--log-error=" + filepath.Join(o.Dir, "mysqld.log"), "--innodb-buffer-pool-size=128M", "--max-connections=1000"}
	if root {
		args = append(args, "--user=root")
	}
	if !isMariaDB(server) {
		args = append(args, "--mysqlx=OFF")
	}
	cmd := exec.Command(server, args...)
	// Its own process group: Ctrl-C in the terminal goes to the command
	// that uses the server, which must be able to finish its work before
	// the server goes (Stop stops it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", server, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	db := &DB{DSN: pointAt(o.DSN, port), Action: StartPrivate, cmd: cmd, dir: o.Dir, log: o.Log}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p, _ := ProbeDSN(ctx, db.DSN); p == Answers {
			break
		}
		select {
		case <-exited:
			err := waitErr
			log, _ := os.ReadFile(filepath.Join(o.Dir, "mysqld.log"))
			return nil, fmt.Errorf("%s stopped at start (%v): %s", server, err, lastLines(string(log), 5))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-exited
			return nil, fmt.Errorf("%s did not answer on port %d within a minute; see %s", server, port, filepath.Join(o.Dir, "mysqld.log"))
		}
	}
	// The port file lets a second command (make test beside make run)
	// find this server instead of starting another on the same data.
	if err := os.WriteFile(filepath.Join(o.Dir, "port"), []byte(strconv.Itoa(port)+"\n"), 0o644); err != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		return nil, err
	}
	db.exited = exited
	fmt.Fprintf(o.Log, "devdb: private server answers on 127.0.0.1:%d\n", port)
	return db, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Owned reports whether Stop stops a server this DB started.
func (d *DB) Owned() bool { return d.cmd != nil }

// Stop shuts down the private server Ensure started, if it did, and waits
// for it; a server that was already running is left alone.
func (d *DB) Stop() error {
	if d.cmd == nil {
		return nil
	}
	os.Remove(filepath.Join(d.dir, "port"))
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-d.exited:
	case <-time.After(60 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		return errors.New("the private server did not stop within a minute; killed")
	}
	d.cmd = nil
	fmt.Fprintln(d.log, "devdb: private server stopped")
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// StartServer starts a private server of the installed mariadbd (or
// mysqld) with its data under dir (initialised on first use) on a free
// port, and returns it with dsn pointed at it (root without a password);
// Stop stops it. Tests that need several servers of their own (one per
// shard) start one per directory.
func StartServer(ctx context.Context, dir, dsn string, log io.Writer) (*DB, error) {
	server := findServer("")
	if server == "" {
		return nil, errors.New("neither mariadbd nor mysqld is installed (apt-get install mariadb-server)")
	}
	if log == nil {
		log = io.Discard
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if _, err := mysql.ParseDSN(dsn); err != nil {
		return nil, fmt.Errorf("the DSN is not a go-sql-driver DSN: %w", err)
	}
	return startPrivate(ctx, server, Options{DSN: dsn, Dir: abs, Log: log})
}

// Restart starts d's stopped private server again on its data directory
// and its port, so that pools pointed at it reconnect (crash recovery when
// it was killed). d must have been returned by StartServer.
func (d *DB) Restart(ctx context.Context) error {
	if d.cmd != nil {
		return errors.New("devdb: the private server is still running")
	}
	cfg, err := mysql.ParseDSN(d.DSN)
	if err != nil {
		return err
	}
	_, p, _ := strings.Cut(cfg.Addr, ":")
	port, err := strconv.Atoi(p)
	if err != nil {
		return fmt.Errorf("devdb: no port in %s", cfg.Addr)
	}
	n, err := startPrivate(ctx, findServer(""), Options{DSN: d.DSN, Dir: d.dir, Log: d.log, Port: port})
	if err != nil {
		return err
	}
	d.cmd, d.exited = n.cmd, n.exited
	return nil
}

// LogTail is the last n lines of the private server's error log ("" when
// there is none), for a test to show why a server went away.
func (d *DB) LogTail(n int) string {
	b, err := os.ReadFile(filepath.Join(d.dir, "mysqld.log"))
	if err != nil {
		return ""
	}
	return lastLines(string(b), n)
}

// Kill ends d's private server at once (SIGKILL), as a crash would, and
// waits for it.
func (d *DB) Kill() error {
	if d.cmd == nil {
		return nil
	}
	os.Remove(filepath.Join(d.dir, "port"))
	if err := d.cmd.Process.Kill(); err != nil {
		return err
	}
	<-d.exited
	d.cmd = nil
	return nil
}
