package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"time"

	"github.com/allot-dev/allot/client"
)

// Open an activity, join it, and read a user's place on the waitlist.
// (Not run by go test: it needs a running stack, `make run`; the same calls
// run against a real stack in TestAgainstTheStack.)
func Example() {
	ctx := context.Background()
	c, err := client.New("http://localhost:8080", client.WithWait(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Open(ctx, 9001, 100); err != nil {
		log.Fatal(err)
	}
	res, err := c.Join(ctx, 9001, 42)
	if err != nil {
		log.Fatal(err)
	}
	switch res.Outcome {
	case client.Confirmed, client.AlreadyConfirmed:
		fmt.Println("you have a seat")
	case client.Waiting, client.AlreadyWaiting:
		s, err := c.Signup(ctx, 9001, 42)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("you are number", *s.Position, "on the waitlist")
	}
}

// A flash-sale tap: Claim never waits for a seat; it is GRANTED or not.
// Retries inside Claim reuse one Idempotency-Key, so a tap is applied once.
func ExampleClient_Claim() {
	c, _ := client.New("http://localhost:8080")
	res, err := c.Claim(context.Background(), 42, 7)
	var apiErr *client.APIError
	switch {
	case errors.As(err, &apiErr):
		fmt.Println("refused:", apiErr.Status, apiErr.Message)
	case err != nil:
		fmt.Println("no answer:", err)
	case res.Outcome == client.Granted:
		fmt.Println("yours, at stream position", res.Seq)
	default:
		fmt.Println(res.Outcome) // SOLD_OUT, ALREADY_OWNED, ...
	}
}

// Holds: in an activity opened with a hold, a seat is first HELD until
// HeldUntil; the user confirms it in time, or it goes back to the head of
// the waitlist (or the pool).
func ExampleClient_Confirm() {
	ctx := context.Background()
	c, _ := client.New("http://localhost:8080")
	if _, err := c.OpenWithHold(ctx, 9003, 100, 10*time.Minute); err != nil {
		log.Fatal(err)
	}
	res, err := c.Join(ctx, 9003, 42)
	if err != nil {
		log.Fatal(err)
	}
	if res.Outcome != client.Held {
		fmt.Println(res.Outcome) // WAITING, ALREADY_CONFIRMED, ...
		return
	}
	fmt.Println("confirm before", res.HeldUntil.Format(time.Kitchen))
	res, err = c.Confirm(ctx, 9003, 42)
	if err != nil {
		log.Fatal(err)
	}
	switch res.Outcome {
	case client.Confirmed, client.AlreadyConfirmed:
		fmt.Println("the seat is yours")
	case client.HoldExpired, client.NotHeld:
		fmt.Println("too late: the seat was released")
	}
}

// Submit now, collect the result later: keep the ack's request id and the
// key, and Wait for the result when it is needed.
func ExampleClient_Submit() {
	ctx := context.Background()
	c, _ := client.New("http://localhost:8080", client.WithWait(0))
	w := client.Write{Op: client.OpCancel, Activity: 9001, User: 42, Key: client.NewKey()}
	_, ack, err := c.Submit(ctx, w)
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Wait(ctx, ack.RequestID)
	if err != nil {
		log.Fatal(err)
	}
	if res.PromotedUserID != nil {
		fmt.Println("the seat went to user", *res.PromotedUserID)
	}
}

// A webhook receiver for the notifier: decode, dedupe by event_id, act.
func ExampleDecodeEvent() {
	seen := map[string]bool{} // a real receiver keeps this durably
	http.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ev, err := client.DecodeEvent(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // a 4xx dead-letters it
			return
		}
		if !seen[ev.EventID] && ev.Kind == client.EventPromoted {
			seen[ev.EventID] = true
			fmt.Printf("user %d got a seat in activity %d\n", ev.UserID, ev.ActivityID)
		}
		w.WriteHeader(http.StatusNoContent)
	})

	ev, err := client.DecodeEvent([]byte(`{"event_id":"5b1e2a4c-9d0f-5e6a-8b7c-1d2e3f4a5b6c","kind":"promoted","activity_id":9001,"user_id":2,` +
		`"request_id":"0190f5e2-7c4a-7b3e-8f00-3c1d2e4f5a6b","seq":12,"at":"2026-12-01T00:00:00Z"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ev.Kind, ev.UserID, ev.Seq)
	// Output: promoted 2 12
}
