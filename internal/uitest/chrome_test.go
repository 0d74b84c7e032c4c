package uitest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/testenv"
)

// TestBrowserReportsProblems: a console error and an uncaught exception
// of the page are what Problems returns, and Eval decodes values.
func TestBrowserReportsProblems(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	b := launch(t, chromium(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	page := `data:text/html,<script>console.error("boom"); setTimeout(() => { throw new Error("bang") }, 0)</script>`
	if err := b.Navigate(ctx, page); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.Eval(ctx, `Promise.resolve(40 + 2)`, &n); err != nil || n != 42 {
		t.Fatalf("Eval = %d, %v; want 42", n, err)
	}
	testenv.WaitFor(t, 10*time.Second, "the console error and the exception reported", func() bool {
		p := strings.Join(b.Problems(), "\n")
		return strings.Contains(p, "console.error") && strings.Contains(p, "boom") && strings.Contains(p, "bang")
	})
}
