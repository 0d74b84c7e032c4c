package uitest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/stacktest"
)

// TestOperatorPageWithToken: with authentication on, the page's feed is
// refused until an allot:operator token is entered in the Token field;
// then the page goes live and follows the activity.
func TestOperatorPageWithToken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	path := chromium(t)
	const key = "uitest-hs256-key-0123456789abcdef0123"
	v, err := auth.New(auth.Config{HS256Key: []byte(key)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	icfg := stacktest.IngestConfig()
	icfg.BadAuthRate = -1
	st := stacktest.Start(t, config.Defaults[allocator.Config](), icfg, ingest.Deps{Verifier: v})
	b := launch(t, path)
	mint := func(sub string, scopes ...string) string {
		tok, err := auth.MintHS256([]byte(key), auth.Claims{Subject: sub, Scopes: scopes})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	const act = 77
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := b.Navigate(ctx, fmt.Sprintf("%s/?activity=%d", st.URL, act)); err != nil {
		t.Fatal(err)
	}
	waitScreen(t, b, 15*time.Second, "the feed is refused without a token", func(sc screen) bool { return sc.Stream == "down" })

	var ok bool
	if err := b.Eval(ctx, fmt.Sprintf(`(() => {
	  document.getElementById('token-input').value = %q;
	  document.getElementById('pick').requestSubmit();
	  return true;
	})()`, mint("ops", auth.ScopeOperator)), &ok); err != nil || !ok {
		t.Fatalf("enter the token: %v", err)
	}
	waitScreen(t, b, 15*time.Second, "the page is live with the token", func(sc screen) bool {
		return sc.Stream == "live" && strings.Contains(sc.Banner, "not open yet")
	})

	req, err := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/v1/activities/%d?wait=5s", st.URL, act), strings.NewReader(`{"capacity": 5}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+mint("1", auth.ScopeAdmin))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("open with an admin token: %d", resp.StatusCode)
	}
	waitScreen(t, b, 15*time.Second, "the page shows the opened activity", func(sc screen) bool {
		return sc.Stream == "live" && number(sc.Capacity) == 5 && number(sc.Remaining) == 5
	})
	var stored string
	if err := b.Eval(ctx, `sessionStorage.getItem('allot.token') ? 'kept' : 'gone'`, &stored); err != nil || stored != "kept" {
		t.Fatalf("the token in sessionStorage: %q, %v; want kept for the tab", stored, err)
	}
}
