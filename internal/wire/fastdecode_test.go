package wire

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// variants are inputs near what AppendJSON writes that the fast decoders
// must either decode as encoding/json does or leave to it.
func variants(enc []byte) [][]byte {
	s := string(enc)
	out := [][]byte{enc, []byte(s + " "), []byte(" " + s), []byte(s + "x"), []byte(s[:len(s)/2]), []byte(s[:len(s)-1])}
	for _, r := range []struct{ from, to string }{
		{`"seq":`, `"seq": `}, {`"seq":`, `"Seq":`}, {`":`, `" :`}, {`,"`, `, "`},
		{`"index":0`, `"index":00`}, {`"index":0`, `"index":-0`}, {`"index":0`, `"index":0.0`}, {`"index":0`, `"index":1e2`},
		{`"user_id":`, `"user_id":-`}, {`"activity_id":`, `"activity_id":99999999999999999999`},
		{`Z"`, `+00:00"`}, {`Z"`, `z"`}, {`T`, `t`}, {`:00Z`, `:60Z`}, {`-11-`, `-13-`}, {`-30T`, `-31T`}, {`.123456`, `,123456`}, {`.123456`, `.1234567890`},
		{`"status":null`, `"status":"x"`}, {`"status":null`, `"status":nul`}, {`"position":null`, `"position":3`}, {`"position":null`, `"position":"3"`},
		{`"hold":"10m0s"`, `"hold":"soon"`}, {`"hold":"10m0s"`, `"hold":10`}, {`"shed":true`, `"shed":false`}, {`"shed":true`, `"shed":tru`},
		{`"promoted_user_ids":[`, `"promoted_user_ids":[]`}, {`"promoted_user_ids":[`, `"promoted_user_ids":[,`},
		{`"request_id":"`, `"request_id":"\u0041`}, {`"request_id":"`, `"request_id":"é`}, {`"request_id":"`, `"request_id":"` + "\t"},
		{`}`, `,"extra":1}`}, {`}`, `,"seq":5}`}, {`{"request_id"`, `{"op":"claim","request_id"`},
	} {
		if strings.Contains(s, r.from) {
			out = append(out, []byte(strings.Replace(s, r.from, r.to, 1)), []byte(strings.ReplaceAll(s, r.from, r.to)))
		}
	}
	return out
}

func someRequests() []Request {
	var out []Request
	at := time.Date(2026, 11, 30, 13, 3, 4, 123456000, time.UTC)
	c := int64(5)
	for _, r := range []Request{
		{RequestID: "01a22c9b-b802-763a-9493-74d3b88e7b49", Op: OpClaim, ActivityID: 9001, UserID: 42, ReceivedAt: at},
		{RequestID: "01a22c9b-b802-763a-9493-74d3b88e7b49", Op: OpOpen, ActivityID: 1, Capacity: &c, Hold: Duration(10 * time.Minute), IdempotencyKey: "key-1", ReceivedAt: at.Add(789)},
		{RequestID: "x", Op: OpExpire, ActivityID: 1, UserID: 2, HoldSeq: 77, HoldIndex: 3, ReceivedAt: at.Truncate(time.Second)},
		{RequestID: "01A22C9B-B802-763A-9493-74D3B88E7B49", Op: OpVoid, UserID: 3, ReceivedAt: at.In(time.FixedZone("x", 3600))},
		{},
	} {
		out = append(out, r)
	}
	for i, s := range oddStrings {
		out = append(out, Request{RequestID: s, Op: Op(oddStrings[(i+1)%len(oddStrings)]), IdempotencyKey: s, ReceivedAt: someTimes()[i%len(someTimes())]})
	}
	return out
}

func TestFastDecodeMatchesUnmarshal(t *testing.T) {
	checked := 0
	for _, r := range someRequests() {
		for _, in := range variants(r.AppendJSON(nil)) {
			var want Request
			wantErr := json.Unmarshal(in, &want)
			var got Request
			gotErr := unmarshalRequest(in, &got)
			if (wantErr == nil) != (gotErr == nil) || wantErr != nil && wantErr.Error() != gotErr.Error() || !reflect.DeepEqual(got, want) {
				t.Fatalf("request %s:\nfast %#v, %v\njson %#v, %v", in, got, gotErr, want, wantErr)
			}
			checked++
		}
	}
	results := someResults()
	for i, r := range results {
		for _, in := range append(variants(AppendResults(nil, []Result{r})), variants(AppendResults(nil, results[i:min(i+3, len(results))]))...) {
			var want ResultBatch
			wantErr := json.Unmarshal(in, &want)
			got, gotErr := DecodeResultBatch(in)
			if (wantErr == nil) != (gotErr == nil) || wantErr != nil && wantErr.Error() != gotErr.Error() || !reflect.DeepEqual(got, want) {
				t.Fatalf("result batch %s:\nfast %#v, %v\njson %#v, %v", in, got, gotErr, want, wantErr)
			}
			checked++
		}
	}
	// The fast decoders take what AppendJSON writes in the common case.
	if _, ok := fastResults(AppendResults(nil, results[:2])); !ok {
		t.Fatal("fastResults gave up on AppendResults' output")
	}
	d := scan{b: someRequests()[1].AppendJSON(nil)}
	if _, ok := d.request(); !ok || d.i != len(d.b) {
		t.Fatal("the fast request decoder gave up on AppendJSON's output")
	}
	t.Logf("%d inputs checked", checked)
}

func TestDecodeMessageFastBatchMatchesSlow(t *testing.T) {
	reqs := someRequests()[:3]
	data := make([][]byte, len(reqs))
	for i, r := range reqs {
		data[i] = r.AppendJSON(nil)
	}
	batch := EncodeBatch(data)
	if _, ok := fastBatch(batch, 3); !ok {
		t.Fatal("fastBatch gave up on EncodeBatch's output")
	}
	for _, in := range [][]byte{batch, []byte(" " + string(batch)), []byte(strings.Replace(string(batch), "},{", "}, {", 1))} {
		for _, n := range []int{2, 3, 4} {
			got, gotErr := DecodeMessage("alloc.req.1", strconv.Itoa(n), in)
			// The slow path alone: json.RawMessage and DecodeRequest.
			var raw []json.RawMessage
			var want []Decoded
			var wantErr error
			if err := json.Unmarshal(in, &raw); err != nil || len(raw) != n {
				wantErr = err
			} else {
				for i, r := range raw {
					req, err := DecodeRequest("alloc.req.1", r)
					want = append(want, batchDecoded(i, req, err))
				}
			}
			if (gotErr == nil) != (wantErr == nil && want != nil) {
				t.Fatalf("batch of %d %s: err %v, want %v", n, in, gotErr, wantErr)
			}
			if gotErr == nil && !reflect.DeepEqual(errText(got), errText(want)) {
				t.Fatalf("batch of %d %s:\nfast %+v\nslow %+v", n, in, got, want)
			}
		}
	}
}

// errText is ds with every error as its text, for comparing.
func errText(ds []Decoded) []any {
	var out []any
	for _, d := range ds {
		e := ""
		if d.Err != nil {
			e = d.Err.Error()
		}
		out = append(out, d.Index, d.Request, e)
	}
	return out
}

func benchResults() []Result {
	st := StatusConfirmed
	at := time.Date(2026, 11, 30, 13, 3, 4, 123456000, time.UTC)
	rs := make([]Result, 80)
	for i := range rs {
		rs[i] = Result{RequestID: "01a22c9b-b802-763a-9493-74d3b88e7b49", State: StateDone, Op: OpClaim, ActivityID: 9001, UserID: int64(i),
			Outcome: OutcomeGranted, Status: &st, Seq: 1234, Index: i, AppliedAt: at}
	}
	return rs
}

// BenchmarkResultBatch compares encoding and decoding a commit's result
// batch with encoding/json (reflect) and without (fast).
func BenchmarkResultBatch(b *testing.B) {
	rs := benchResults()
	data := AppendResults(nil, rs)
	b.Run("encode/reflect", func(b *testing.B) {
		for b.Loop() {
			json.Marshal(ResultBatch{Results: rs}) //nolint:errcheck
		}
	})
	b.Run("encode/fast", func(b *testing.B) {
		for b.Loop() {
			AppendResults(nil, rs)
		}
	})
	b.Run("decode/reflect", func(b *testing.B) {
		for b.Loop() {
			var rb ResultBatch
			json.Unmarshal(data, &rb) //nolint:errcheck
		}
	})
	b.Run("decode/fast", func(b *testing.B) {
		for b.Loop() {
			DecodeResultBatch(data) //nolint:errcheck
		}
	})
}

// BenchmarkRequestBatch compares encoding a request and decoding a batch
// of 80 with encoding/json and without.
func BenchmarkRequestBatch(b *testing.B) {
	r := Request{RequestID: "01a22c9b-b802-763a-9493-74d3b88e7b49", Op: OpClaim, ActivityID: 9001, UserID: 42, ReceivedAt: time.Now().UTC()}
	data := make([][]byte, 80)
	for i := range data {
		data[i] = r.AppendJSON(nil)
	}
	batch := EncodeBatch(data)
	b.Run("encode/reflect", func(b *testing.B) {
		for b.Loop() {
			json.Marshal(r) //nolint:errcheck
		}
	})
	b.Run("encode/fast", func(b *testing.B) {
		for b.Loop() {
			r.AppendJSON(make([]byte, 0, 192))
		}
	})
	b.Run("decode/reflect", func(b *testing.B) {
		for b.Loop() {
			var raw []json.RawMessage
			json.Unmarshal(batch, &raw) //nolint:errcheck
			for _, x := range raw {
				var q Request
				json.Unmarshal(x, &q) //nolint:errcheck
			}
		}
	})
	b.Run("decode/fast", func(b *testing.B) {
		for b.Loop() {
			DecodeMessage("alloc.req.9001", "80", batch) //nolint:errcheck
		}
	})
}
