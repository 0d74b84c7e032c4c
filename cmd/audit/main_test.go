package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/syncbuf"
	"github.com/allot-dev/allot/internal/wire"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		want    audit.Config
		json    bool
		wantErr string
	}{
		{name: "defaults", args: nil},
		{name: "all flags", args: []string{"-activity", "3, 1,2", "-from-seq", "7", "-json"},
			want: audit.Config{Activities: []int64{3, 1, 2}, FromSeq: 7}, json: true},
		{name: "from time", args: []string{"-from-time", "2025-01-31T18:00:00Z"},
			want: audit.Config{FromTime: time.Date(2025, 1, 31, 18, 0, 0, 0, time.UTC)}},
		{name: "seq and time", args: []string{"-from-seq", "1", "-from-time", "2025-01-31T18:00:00Z"}, wantErr: "exclude each other"},
		{name: "from checkpoint", args: []string{"-from-checkpoint", "-json"}, want: audit.Config{FromCheckpoint: true}, json: true},
		{name: "checkpoint and seq", args: []string{"-from-checkpoint", "-from-seq", "4"}, wantErr: "-from-checkpoint excludes"},
		{name: "bad activity", args: []string{"-activity", "1,x"}, wantErr: `"x" is not a positive activity id`},
		{name: "zero activity", args: []string{"-activity", "0"}, wantErr: "not a positive activity id"},
		{name: "bad time", args: []string{"-from-time", "yesterday"}, wantErr: "not an RFC3339 time"},
		{name: "bad seq", args: []string{"-from-seq", "-1"}, wantErr: "invalid value"},
		{name: "unknown flag", args: []string{"-everything"}, wantErr: "not defined"},
		{name: "stray argument", args: []string{"now"}, wantErr: "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f audit.Config
			asJSON, err := parseFlags(tt.args, io.Discard, &f)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if asJSON != tt.json || f.FromSeq != tt.want.FromSeq || !f.FromTime.Equal(tt.want.FromTime) ||
				f.FromCheckpoint != tt.want.FromCheckpoint || len(f.Activities) != len(tt.want.Activities) {
				t.Fatalf("flags = %+v json=%v, want %+v json=%v", f, asJSON, tt.want, tt.json)
			}
			for i := range tt.want.Activities {
				if f.Activities[i] != tt.want.Activities[i] {
					t.Fatalf("activities = %v, want %v", f.Activities, tt.want.Activities)
				}
			}
		})
	}
}

func TestReportExitCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		rep  audit.Report
		err  error
		want int
	}{
		{"clean", audit.Report{OK: true}, nil, exitOK},
		{"diverged", audit.Report{Divergences: []audit.Divergence{{Seq: 3, Kind: audit.KindResultMissing}}}, nil, exitDiverged},
		{"error", audit.Report{}, audit.ErrIncompleteStream, exitError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := report(tt.rep, tt.err, false, io.Discard, io.Discard); got != tt.want {
				t.Fatalf("exit code = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestBinary builds cmd/audit and runs it against a real MariaDB database
// and JetStream server whose traffic a real allocator applied.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "audit")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	db, ns := dbtest.New(t), natstest.New(t)
	nc, js := ns.Connect(t)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js, config.Defaults[bus.Config]()); err != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(config.Defaults[allocator.Config](), allocator.Deps{DB: db.DB, NATS: nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	capacity := int64(1)
	var last uint64
	var join wire.Request
	for _, r := range []wire.Request{
		{Op: wire.OpOpen, ActivityID: 7, Capacity: &capacity},
		{Op: wire.OpJoin, ActivityID: 7, UserID: 1},
		{Op: wire.OpJoin, ActivityID: 7, UserID: 2},
	} {
		r.RequestID, r.ReceivedAt = uuid.Must(uuid.NewV7()).String(), time.Now().UTC()
		b, _ := json.Marshal(r)
		ack, err := js.Publish(ctx, wire.RequestSubject(7), b, jetstream.WithMsgID(r.RequestID))
		if err != nil {
			t.Fatal(err)
		}
		last, join = ack.Sequence, r
	}
	deadline := time.Now().Add(20 * time.Second)
	for db.Count(t, "SELECT COALESCE(MAX(last_seq), 0) FROM allocator_partition") < int64(last) {
		if time.Now().After(deadline) {
			t.Fatal("the allocator did not apply the requests within 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}

	env := []string{"ALLOT_NATS_URL=" + ns.URL(), "ALLOT_MYSQL_DSN=" + db.DSN}
	runBin := func(t *testing.T, env []string, args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return 0, stdout.String(), stderr.String()
		case errors.As(err, &exit):
			return exit.ExitCode(), stdout.String(), stderr.String()
		}
		t.Fatalf("run audit: %v", err)
		return 0, "", ""
	}

	t.Run("clean", func(t *testing.T) {
		code, out, errOut := runBin(t, env)
		if code != 0 || !strings.HasSuffix(out, "\nOK\n") {
			t.Fatalf("exit %d, want 0 and OK\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		if !strings.Contains(errOut, "ALLOT_NATS_URL=") {
			t.Fatalf("the effective configuration is not printed:\n%s", errOut)
		}
	})
	t.Run("clean json", func(t *testing.T) {
		code, out, _ := runBin(t, env, "-json", "-activity", "7")
		var rep audit.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || !rep.OK || rep.Compared != 3 {
			t.Fatalf("exit %d, report %+v (%v), want 0, OK, 3 compared\n%s", code, rep, err, out)
		}
	})
	t.Run("from checkpoint", func(t *testing.T) {
		// No checkpoint yet and the stream whole: verified from seq 1.
		code, out, _ := runBin(t, env, "-from-checkpoint")
		if code != 0 || !strings.Contains(out, "verified:             seq 1..") {
			t.Fatalf("exit %d, want 0 and the verified range\n%s", code, out)
		}
	})
	t.Run("tampered", func(t *testing.T) {
		if _, err := db.Exec("UPDATE activity_signup SET status = 'CONFIRMED' WHERE activity_id = 7 AND user_id = 2"); err != nil {
			t.Fatal(err)
		}
		code, out, _ := runBin(t, env)
		if _, err := db.Exec("UPDATE activity_signup SET status = 'WAITING' WHERE activity_id = 7 AND user_id = 2"); err != nil {
			t.Fatal(err)
		}
		want := "seq 3 request_id " + join.RequestID + " activity 7 user 2: signup status: expected WAITING, actual CONFIRMED"
		if code != 1 || !strings.Contains(out, want) {
			t.Fatalf("exit %d, want 1 and %q\nstdout:\n%s", code, want, out)
		}
		t.Logf("report of a tampered database:\n%s", out)
	})
	t.Run("bad flags", func(t *testing.T) {
		code, _, errOut := runBin(t, env, "-from-seq", "2", "-from-time", "2025-01-31T18:00:00Z")
		if code != 2 || !strings.Contains(errOut, "exclude each other") {
			t.Fatalf("exit %d, want 2 and a clear line\nstderr:\n%s", code, errOut)
		}
	})
	t.Run("no nats url", func(t *testing.T) {
		code, _, errOut := runBin(t, []string{"ALLOT_NATS_URL=", "ALLOT_MYSQL_DSN=" + db.DSN})
		if code != 2 || !strings.Contains(errOut, "ALLOT_NATS_URL is empty") {
			t.Fatalf("exit %d, want 2\nstderr:\n%s", code, errOut)
		}
	})
	t.Run("unreachable mysql", func(t *testing.T) {
		code, _, errOut := runBin(t, []string{"ALLOT_NATS_URL=" + ns.URL(), "ALLOT_MYSQL_DSN=root@tcp(127.0.0.1:1)/allot"})
		if code != 2 || !strings.Contains(errOut, "mysql is unreachable") {
			t.Fatalf("exit %d, want 2\nstderr:\n%s", code, errOut)
		}
	})
	t.Run("unreachable nats", func(t *testing.T) {
		code, _, errOut := runBin(t, []string{"ALLOT_NATS_URL=nats://127.0.0.1:1", "ALLOT_MYSQL_DSN=" + db.DSN})
		if code != 2 || !strings.Contains(errOut, "broker is unavailable") {
			t.Fatalf("exit %d, want 2\nstderr:\n%s", code, errOut)
		}
	})
}

// TestShardsExitCodes: with ALLOT_MYSQL_SHARDS naming two shards, the
// command audits each partition on its shard and prints a report per
// shard: exit 0 when both are clean, 1 when a row of one diverges (named
// under that shard), 2 when a shard does not answer (named on stderr,
// the other shard still reported).
func TestShardsExitCodes(t *testing.T) {
	a, b, ns := dbtest.New(t), dbtest.New(t), natstest.New(t)
	nc, js := ns.Connect(t)
	ctx := context.Background()
	const partitions = 2
	if _, err := bus.Setup(ctx, js, natstest.Config(partitions), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults[allocator.Config]()
	cfg.Partitions, cfg.MetricsAddr = partitions, ""
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- allocator.Run(runCtx, cfg, allocator.Deps{DB: a.DB, Shards: shards.Pools{"a": a.DB, "b": b.DB}, NATS: nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("allocator.Run: %v", err)
		}
	})
	// One activity on each partition, so on each shard.
	var acts []int64
	for id := int64(1); len(acts) < partitions; id++ {
		if bus.PartitionOf(id, partitions) == len(acts) {
			acts = append(acts, id)
		}
	}
	capacity := int64(1)
	var last uint64
	for _, id := range acts {
		for _, r := range []wire.Request{{Op: wire.OpOpen, ActivityID: id, Capacity: &capacity}, {Op: wire.OpJoin, ActivityID: id, UserID: 1}} {
			r.RequestID, r.ReceivedAt = uuid.Must(uuid.NewV7()).String(), time.Now().UTC()
			last = natstest.PublishRequest(t, js, r, "")
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for a.Count(t, "SELECT COUNT(*) FROM processed_request")+b.Count(t, "SELECT COUNT(*) FROM processed_request") < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the allocator did not apply the requests up to %d within 20s", last)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Setenv("ALLOT_NATS_URL", ns.URL())
	t.Setenv("ALLOT_MYSQL_DSN", a.DSN)
	t.Setenv("ALLOT_MYSQL_SHARDS", "a="+a.DSN+",b="+b.DSN)
	runAudit := func(args ...string) (int, string, string) {
		// The connection's handlers may log after run returns.
		var stdout, stderr syncbuf.Buffer
		code := run(ctx, args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	if code, out, errOut := runAudit(); code != 0 || !strings.Contains(out, "== shard a (partitions 0) ==") || !strings.HasSuffix(out, "shards: a OK, b OK\nOK\n") {
		t.Fatalf("clean shards: exit %d, want 0 and a report per shard\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	code, out, _ := runAudit("-json")
	var rep struct {
		OK     bool `json:"ok"`
		Shards []struct {
			Shard    string `json:"shard"`
			OK       bool   `json:"ok"`
			Compared int    `json:"compared"`
		} `json:"shards"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || !rep.OK || len(rep.Shards) != 2 || rep.Shards[1].Shard != "b" || rep.Shards[1].Compared != 2 {
		t.Fatalf("clean shards, -json: exit %d, %+v (%v)\n%s", code, rep, err, out)
	}

	if _, err := b.Exec("UPDATE activity SET capacity = 5 WHERE id = ?", acts[1]); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runAudit()
	if _, err := b.Exec("UPDATE activity SET capacity = 1 WHERE id = ?", acts[1]); err != nil {
		t.Fatal(err)
	}
	if want := "shard b activity " + strconv.FormatInt(acts[1], 10) + ": activity capacity: expected 1, actual 5"; code != 1 || !strings.Contains(out, want) || !strings.Contains(out, "shards: a OK, b 1 divergence(s)") {
		t.Fatalf("a tampered row on b: exit %d, want 1 and %q\n%s", code, want, out)
	}

	t.Setenv("ALLOT_MYSQL_SHARDS", "a="+a.DSN+",b=root:secret@tcp(127.0.0.1:1)/allot")
	code, out, errOut := runAudit()
	if code != 2 || !strings.Contains(errOut, "shard b does not answer") || strings.Contains(errOut, "secret") ||
		!strings.Contains(out, "shards: a OK, b not audited") {
		t.Fatalf("shard b down: exit %d, want 2, b named on stderr and a still reported\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
