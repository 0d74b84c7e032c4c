package faults

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// suite is what TestMain prepared for the scenarios.
var suite struct {
	// bin holds the built binaries: allocator, ingest, natsd.
	bin string
	// skip, when set, is why every scenario skips.
	skip string
	// buildErr, when set, fails every scenario.
	buildErr error
}

func TestMain(m *testing.M) {
	flag.Parse()
	// Scenario 5 kills the test's own idle connections too; the driver
	// would log each one it finds dead.
	mysql.SetLogger(log.New(io.Discard, "", 0)) //nolint:errcheck
	if testing.Short() {
		suite.skip = "fault-injection suite skipped under -short: it builds the binaries and runs real processes for minutes"
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "allot-faults-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
		os.Exit(1)
	}
	suite.bin = dir
	suite.buildErr = build(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// build compiles the binaries the scenarios run into dir, once.
func build(dir string) error {
	start := time.Now()
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the go command is needed to build the binaries: %w", err)
	}
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if buildRace() {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/allocator", "./cmd/ingest", "./cmd/allotctl", "./cmd/notifier", "./internal/cmd/natsd")
	cmd := exec.Command(goBin, args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s in %s: %w\n%s", strings.Join(args, " "), root, err, stderr.String())
	}
	// The real nats-server, from the module the embedded server comes
	// from, for the permissions scenario (deploy/nats/accounts.conf).
	cmd = exec.Command(goBin, "build", "-o", filepath.Join(dir, "nats-server"), "github.com/nats-io/nats-server/v2")
	cmd.Dir = root
	stderr.Reset()
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build nats-server in %s: %w\n%s", root, err, stderr.String())
	}
	fmt.Printf("faults: built allocator, ingest, allotctl, notifier, natsd, nats-server in %s (race detector %t, %s)\n", dir, buildRace(), time.Since(start).Round(time.Millisecond))
	return nil
}

// buildRace says whether the binaries get the race detector: when the
// tests run with it (go test -race, as make test does), or when
// ALLOT_FAULTS_RACE=1; ALLOT_FAULTS_RACE=0 turns it off.
func buildRace() bool {
	switch os.Getenv("ALLOT_FAULTS_RACE") {
	case "1":
		return true
	case "0":
		return false
	}
	return raceEnabled
}

// needSuite skips or fails t when the suite cannot run.
func needSuite(t *testing.T) {
	t.Helper()
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	if suite.buildErr != nil {
		t.Fatalf("building the binaries failed: %v", suite.buildErr)
	}
}
