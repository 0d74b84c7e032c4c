// Command probe is the health check of allot's container image: the image is
// distroless (no shell, no curl, no wget), so `docker compose` health checks
// run this instead. It GETs one URL and exits 0 on a 2xx answer, 1 otherwise.
// Kubernetes does not need it: its httpGet probes call the binaries directly.
//
//	probe http://127.0.0.1:8080/readyz
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: probe URL")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		fmt.Fprintf(stderr, "probe: %v\n", err)
		return 2
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "probe: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // drained for the connection's sake only
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		fmt.Fprintf(stderr, "probe: %s answered %s\n", args[0], resp.Status)
		return 1
	}
	return 0
}
