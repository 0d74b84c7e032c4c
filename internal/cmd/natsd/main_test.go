package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/syncbuf"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		want    cfg
		wantErr string
	}{
		{name: "defaults", want: cfg{Host: "127.0.0.1", Port: 4233, Store: "var/nats"}},
		{name: "env", env: map[string]string{"ALLOT_EMBEDDED_NATS_PORT": "5000", "ALLOT_EMBEDDED_NATS_SYNC": "1s"},
			want: cfg{Host: "127.0.0.1", Port: 5000, Store: "var/nats", Sync: time.Second}},
		{name: "flags override env", env: map[string]string{"ALLOT_EMBEDDED_NATS_PORT": "5000"},
			args: []string{"-host", "0.0.0.0", "-port", "-1", "-store", "/tmp/x", "-sync", "250ms"},
			want: cfg{Host: "0.0.0.0", Port: -1, Store: "/tmp/x", Sync: 250 * time.Millisecond}},
		{name: "bad port", args: []string{"-port", "70000"}, wantErr: "must be -1, 0"},
		{name: "negative sync", args: []string{"-sync", "-1s"}, wantErr: "must not be negative"},
		{name: "empty store", args: []string{"-store", ""}, wantErr: "must not be empty"},
		{name: "bad env", env: map[string]string{"ALLOT_EMBEDDED_NATS_SYNC": "soon"}, wantErr: "read configuration"},
		{name: "stray argument", args: []string{"now"}, wantErr: "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"HOST", "PORT", "STORE", "SYNC"} {
				// t.Setenv restores the variable at the end; unset it for
				// the test, since an empty value would count as set.
				t.Setenv("ALLOT_EMBEDDED_NATS_"+k, "")
				os.Unsetenv("ALLOT_EMBEDDED_NATS_" + k)
			}
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			got, err := load(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("load = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestRunRestartKeepsStore runs the server, stores a message, stops it with
// a cancelled context (what SIGTERM does), starts it again on the same port
// and store and finds the message.
func TestRunRestartKeepsStore(t *testing.T) {
	store := t.TempDir()
	url, stop := startRun(t, "-port", "-1", "-store", store, "-sync", "0")
	nc, js := connect(t, url)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.1", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if code := stop(); code != 0 {
		t.Fatalf("exit code %d after shutdown, want 0", code)
	}

	port := url[strings.LastIndexByte(url, ':')+1:]
	url2, stop2 := startRun(t, "-port", port, "-store", store)
	if url2 != url {
		t.Fatalf("restarted at %s, want %s", url2, url)
	}
	_, js = connect(t, url2)
	st, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatalf("stream lost across the restart: %v", err)
	}
	msg, err := st.GetMsg(ctx, 1)
	if err != nil || string(msg.Data) != "kept" {
		t.Fatalf("message 1 = %v, %v; want \"kept\"", msg, err)
	}
	if code := stop2(); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

func TestRunPortTaken(t *testing.T) {
	url, stop := startRun(t, "-port", "-1", "-store", t.TempDir())
	defer stop()
	port := url[strings.LastIndexByte(url, ':')+1:]
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"-port", port, "-store", t.TempDir()}, io.Discard, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "pick another port with -port") {
		t.Fatalf("code %d, stderr %q; want 2 and a hint", code, stderr.String())
	}
}

// TestRunRoutePortTaken: a cluster node whose route port is taken says
// so at once, rather than after the wait for a server that never listens.
func TestRunRoutePortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"-port", "-1", "-store", t.TempDir(), "-cluster", "c", "-name", "n1",
		"-cluster-port", port, "-routes", "nats-route://127.0.0.1:" + port}, io.Discard, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "route port "+port+" is taken") {
		t.Fatalf("code %d, stderr %q; want 2 and the route port named", code, stderr.String())
	}
}

// startRun runs run in the background and returns the URL it printed and a
// function that stops it and returns its exit code.
func startRun(t *testing.T, args ...string) (string, func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, args, pw, &stderr)
		pw.Close()
	}()
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, pr) //nolint:errcheck
	}()
	var url string
	select {
	case url = <-lines:
	case <-time.After(20 * time.Second):
	}
	if !strings.HasPrefix(url, "nats://") {
		cancel()
		t.Fatalf("natsd printed %q, want its client URL; stderr:\n%s", url, stderr.String())
	}
	var code *int
	stop := func() int {
		if code == nil {
			cancel()
			select {
			case c := <-done:
				code = &c
			case <-time.After(20 * time.Second):
				t.Fatalf("natsd did not stop within 20s; stderr:\n%s", stderr.String())
			}
		}
		return *code
	}
	t.Cleanup(func() { stop() })
	return url, stop
}

func connect(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
