package wire

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"
)

// oddStrings are strings that need escaping or are not valid UTF-8, next
// to plain ones.
var oddStrings = []string{"", "r", "01a22c9b-b802-763a-9493-74d3b88e7b49", "a\"b\\c<d>&\n\r\t\x01é\u2028\u2029", "\xff\xfe", "日本", "\x7f"}

func someTimes() []time.Time {
	at := time.Date(2026, 11, 30, 13, 3, 4, 123456000, time.UTC)
	return []time.Time{at, at.Truncate(time.Second), at.Add(789), {}, at.In(time.FixedZone("x", 3600)), at.In(time.FixedZone("y", -5*3600-30*60)), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)}
}

func TestRequestAppendJSONMatchesMarshal(t *testing.T) {
	ints := []int64{0, 1, -1, 42, math.MaxInt64, math.MinInt64}
	var reqs []Request
	for i, s := range oddStrings {
		for j, at := range someTimes() {
			k := i*len(someTimes()) + j
			c := ints[k%len(ints)]
			r := Request{
				RequestID:  s,
				Op:         []Op{OpOpen, OpJoin, OpCancel, OpClaim, OpConfirm, OpExpire, OpVoid, Op(s)}[k%8],
				ActivityID: ints[(k+1)%len(ints)],
				UserID:     ints[(k+2)%len(ints)],
				ReceivedAt: at,
			}
			reqs = append(reqs, r)
			r.Capacity = &c
			r.Hold = []Duration{0, Duration(10 * time.Minute), Duration(1500 * time.Millisecond), Duration(-time.Second), Duration(MaxHold)}[k%5]
			r.HoldSeq = []uint64{0, 1, math.MaxUint64}[k%3]
			r.HoldIndex = []int{0, 1, MaxBatch - 1, -1}[k%4]
			r.IdempotencyKey = oddStrings[(k+3)%len(oddStrings)]
			reqs = append(reqs, r)
		}
	}
	reqs = append(reqs, Request{}, ExpireRequest(3, 4, Place(99, 7), time.Unix(100, 5)))
	for i, r := range reqs {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.AppendJSON(nil); string(got) != string(want) {
			t.Fatalf("request %d: AppendJSON = %s\nencoding/json = %s", i, got, want)
		}
		// Appending keeps what the buffer held.
		if got := r.AppendJSON([]byte("x")); string(got) != "x"+string(want) {
			t.Fatalf("request %d: AppendJSON to a buffer = %s", i, got)
		}
	}
}

func someResults() []Result {
	ints := []int64{0, 1, -1, 42, math.MaxInt64, math.MinInt64}
	statuses := []Status{StatusConfirmed, StatusWaiting, StatusCancelled, StatusHeld, Status("<odd>")}
	var out []Result
	for i, s := range oddStrings {
		for j, at := range someTimes() {
			k := i*len(someTimes()) + j
			r := Result{
				RequestID:  s,
				State:      []string{StateDone, StatePending, s}[k%3],
				Op:         []Op{OpOpen, OpJoin, OpCancel, OpClaim, OpConfirm, OpExpire, OpVoid}[k%7],
				ActivityID: ints[k%len(ints)],
				UserID:     ints[(k+1)%len(ints)],
				Outcome:    []Outcome{OutcomeGranted, OutcomeSoldOut, OutcomeRejected, Outcome(s)}[k%4],
				Seq:        []uint64{0, 1, math.MaxUint64}[k%3],
				Index:      []int{0, 1, MaxBatch - 1, -1}[k%4],
				AppliedAt:  at,
			}
			out = append(out, r)
			st := statuses[k%len(statuses)]
			pos, prom, c := ints[(k+2)%len(ints)], ints[(k+3)%len(ints)], ints[(k+4)%len(ints)]
			held := someTimes()[(j+1)%len(someTimes())]
			r.Status, r.Position, r.PromotedUserID, r.Capacity, r.HeldUntil = &st, &pos, &prom, &c, &held
			r.PromotedUserIDs = [][]int64{nil, {}, {7}, {1, -2, math.MaxInt64}}[k%4]
			r.Reason = oddStrings[(k+1)%len(oddStrings)]
			r.Shed = k%2 == 0
			out = append(out, r)
		}
	}
	return append(out, Result{})
}

func TestResultAppendJSONMatchesMarshal(t *testing.T) {
	for i, r := range someResults() {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.AppendJSON(nil); string(got) != string(want) {
			t.Fatalf("result %d: AppendJSON = %s\nencoding/json = %s", i, got, want)
		}
		var back Result
		if err := json.Unmarshal(r.AppendJSON(nil), &back); err != nil {
			t.Fatalf("result %d does not decode: %v", i, err)
		}
	}
}

func TestAppendResultsMatchesMarshal(t *testing.T) {
	all := someResults()
	for _, n := range []int{0, 1, 2, len(all)} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			want, err := json.Marshal(ResultBatch{Results: all[:n]})
			if err != nil {
				t.Fatal(err)
			}
			if got := AppendResults(nil, all[:n]); string(got) != string(want) {
				t.Fatalf("AppendResults = %s\nencoding/json = %s", got, want)
			}
		})
	}
}
