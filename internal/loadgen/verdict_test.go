package loadgen

import (
	"errors"
	"testing"
	"time"
)

func TestVerdict(t *testing.T) {
	// pass is a clean flash sale: 2,000 claims from 1,800 users for 100.
	pass := func() Report {
		return Report{
			Capacity: 100, Requests: 2000, Users: 1800, Mix: DefaultMix, Results: 2000,
			Outcomes: map[string]int{"GRANTED": 100, "SOLD_OUT": 1850, "ALREADY_OWNED": 50},
			Before:   &State{Capacity: 100, Remaining: 100},
			After:    &State{Capacity: 100, Confirmed: 100},
		}
	}
	tests := []struct {
		name   string
		change func(*Report)
		want   []error // nil = pass
	}{
		{"clean sale", func(*Report) {}, nil},
		{"oversold by the results", func(r *Report) {
			r.Outcomes["GRANTED"] = 101
			r.After = &State{Capacity: 100, Confirmed: 101, Remaining: -1}
		}, []error{ErrOversold}},
		{"oversold by the state only", func(r *Report) {
			r.After = &State{Capacity: 100, Confirmed: 101, Remaining: -1}
		}, []error{ErrOversold, ErrAccounting}},
		{"undersold", func(r *Report) {
			r.Outcomes["GRANTED"] = 99
			r.After = &State{Capacity: 100, Confirmed: 99, Remaining: 1}
		}, []error{ErrUndersold}},
		{"fewer users than seats: all granted is right", func(r *Report) {
			r.Users, r.Outcomes["GRANTED"] = 60, 60
			r.After = &State{Capacity: 100, Confirmed: 60, Remaining: 40}
		}, nil},
		{"fewer users than seats: one missing", func(r *Report) {
			r.Users, r.Outcomes["GRANTED"] = 60, 59
			r.After = &State{Capacity: 100, Confirmed: 59, Remaining: 41}
		}, []error{ErrUndersold}},
		{"fewer users than seats: one claim never stored", func(r *Report) {
			r.Users, r.Outcomes["GRANTED"], r.Outcomes["REJECTED"] = 60, 59, 1
			r.After = &State{Capacity: 100, Confirmed: 59, Remaining: 41}
		}, nil},
		{"double grant", func(r *Report) { r.DoubleGrantUsers, r.DoubleGrants = 1, []int64{7} }, []error{ErrDoubleGrant}},
		{"incomplete", func(r *Report) { r.Results, r.Errors = 1990, 10 }, []error{ErrIncomplete}},
		{"counters drift", func(r *Report) { r.After.Remaining = 3 }, []error{ErrAccounting}},
		{"waiting while a seat is free", func(r *Report) {
			r.Mix = Mix{Join: 1}
			r.Outcomes = map[string]int{"CONFIRMED": 99, "WAITING": 5}
			r.After = &State{Capacity: 100, Confirmed: 99, Waiting: 5, Remaining: 1}
		}, []error{ErrUndersold}},
		{"join burst with a waitlist", func(r *Report) {
			r.Mix = Mix{Join: 1}
			r.Outcomes = map[string]int{"CONFIRMED": 100, "WAITING": 1700, "ALREADY_WAITING": 200}
			r.After = &State{Capacity: 100, Confirmed: 100, Waiting: 1700}
		}, nil},
		{"join burst, waitlist lost a row", func(r *Report) {
			r.Mix = Mix{Join: 1}
			r.Outcomes = map[string]int{"CONFIRMED": 100, "WAITING": 1700, "ALREADY_WAITING": 200}
			r.After = &State{Capacity: 100, Confirmed: 100, Waiting: 1699}
		}, []error{ErrAccounting}},
		{"claims and cancels add up", func(r *Report) {
			r.Mix = Mix{Claim: 3, Cancel: 1}
			r.Outcomes = map[string]int{"GRANTED": 130, "CANCELLED": 40, "SOLD_OUT": 1300, "NOT_SIGNED_UP": 530}
			r.After = &State{Capacity: 100, Confirmed: 90, Remaining: 10}
		}, nil},
		{"claims and cancels do not add up", func(r *Report) {
			r.Mix = Mix{Claim: 3, Cancel: 1}
			r.Outcomes = map[string]int{"GRANTED": 130, "CANCELLED": 40, "SOLD_OUT": 1300, "NOT_SIGNED_UP": 530}
			r.After = &State{Capacity: 100, Confirmed: 91, Remaining: 9}
		}, []error{ErrAccounting}},
		{"reused activity: no exact grant count", func(r *Report) {
			r.Before = &State{Capacity: 100, Confirmed: 100}
			r.Outcomes = map[string]int{"SOLD_OUT": 1900, "ALREADY_OWNED": 100}
		}, nil},
		{"several failures at once", func(r *Report) {
			r.Outcomes["GRANTED"] = 104
			r.After = &State{Capacity: 100, Confirmed: 104, Remaining: -4}
			r.DoubleGrantUsers = 4
		}, []error{ErrOversold, ErrDoubleGrant}},
	}
	all := []error{ErrIncomplete, ErrOversold, ErrUndersold, ErrDoubleGrant, ErrAccounting}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := pass()
			tt.change(&r)
			checkVerdict(t, r.Verdict(), tt.want, all)
		})
	}
}

func TestVerdictHolds(t *testing.T) {
	// pass is a settled hold burst on an empty activity: 30 users held,
	// 20 confirmed, the no-shows' seats lapsed and went to the line.
	pass := func() Report {
		return Report{
			Capacity: 20, Requests: 400, Users: 120, Mix: Mix{Claim: 1, Join: 2, Confirm: 0.5}, Results: 400,
			Outcomes: map[string]int{"HELD": 20, "WAITING": 99, "SOLD_OUT": 38, "NOT_HELD": 26, "ALREADY_WAITING": 148,
				"CONFIRMED": 3, "ALREADY_CONFIRMED": 66},
			Before: &State{Capacity: 20, Remaining: 20, Hold: "300ms"},
			After:  &State{Capacity: 20, Confirmed: 20, Waiting: 40, Hold: "300ms"},
			Holds: &HoldReport{Hold: 300 * time.Millisecond, NoShow: 0.3, HeldUsers: 30, NoShowsHeld: 10,
				Confirms: map[string]int{"CONFIRMED": 17}, Settled: true, Checked: 110, ConfirmedSignups: 20},
		}
	}
	tests := []struct {
		name   string
		change func(*Report)
		want   []error // nil = pass
	}{
		{"settled", func(*Report) {}, nil},
		{"never settled", func(r *Report) {
			r.Holds.Settled, r.After.Held, r.Holds.StillHeld = false, 3, 3
		}, []error{ErrHolds}},
		{"held left over", func(r *Report) { r.After.Held = 1 }, []error{ErrHolds}},
		{"a no-show confirmed", func(r *Report) { r.Holds.NoShowsConfirmed = 1 }, []error{ErrHolds}},
		{"a hold vanished", func(r *Report) { r.Holds.LostHolds = 2 }, []error{ErrHolds}},
		{"a confirmed seat vanished", func(r *Report) { r.Holds.LostSeats = 1 }, []error{ErrHolds}},
		{"confirms unanswered", func(r *Report) { r.Holds.ConfirmErrors = 4 }, []error{ErrHolds}},
		{"counter beside the signups", func(r *Report) {
			r.After.Confirmed, r.After.Remaining = 19, 1
			r.After.Waiting = 0
		}, []error{ErrAccounting}},
		{"reused activity: no signup count", func(r *Report) {
			r.Before.Confirmed, r.Holds.ConfirmedSignups, r.Holds.Confirms["CONFIRMED"] = 5, 15, 12
		}, nil},
		{"double seat", func(r *Report) { r.DoubleGrantUsers, r.DoubleGrants = 1, []int64{9} }, []error{ErrDoubleGrant}},
		{"seats recycle: more HELD than capacity is no oversale", func(r *Report) {
			r.Outcomes["HELD"] = 60
		}, nil},
		{"confirmed seats beyond capacity", func(r *Report) {
			r.Holds.Confirms["CONFIRMED"] = 25
		}, []error{ErrOversold}},
		{"waiting while a seat is free", func(r *Report) {
			r.After.Confirmed, r.After.Remaining, r.Holds.ConfirmedSignups = 19, 1, 19
		}, []error{ErrUndersold}},
	}
	all := []error{ErrIncomplete, ErrOversold, ErrUndersold, ErrDoubleGrant, ErrAccounting, ErrHolds}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := pass()
			tt.change(&r)
			checkVerdict(t, r.Verdict(), tt.want, all)
		})
	}
}

// checkVerdict: a verdict with nothing wanted is a pass; otherwise err
// matches (errors.Is) exactly those of the sentinels all that one of want
// matches.
func checkVerdict(t *testing.T, err error, want, all []error) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("Verdict = %v, want pass", err)
		}
		return
	}
	for _, sentinel := range all {
		w := false
		for _, x := range want {
			w = w || errors.Is(x, sentinel)
		}
		if got := errors.Is(err, sentinel); got != w {
			t.Errorf("errors.Is(Verdict, %v) = %v, want %v (verdict: %v)", sentinel, got, w, err)
		}
	}
}
