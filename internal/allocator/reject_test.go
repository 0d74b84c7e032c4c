package allocator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// TestRejectOnlyTheMessageThatFailed: a transaction that failed on one
// message leads to rejecting that message, identified by its stream
// sequence, and no other. When the partition has moved on meanwhile (two
// allocators overlapping), the message now next after the fence is valid
// and must not be rejected for an earlier transaction's cause. A rejected
// request reads REJECTED, with its identity and reason.
func TestRejectOnlyTheMessageThatFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	first := e.publish(open(1, 2), "")
	a := e.start(conf(nil), TestHooks{})
	e.waitFence(first)
	a.Stop()

	good := req(wire.OpJoin, 1, 1)
	next := e.publish(good, "")
	cause := errors.New("a refusal by MySQL")
	// The failure was on the message after next: next is not it.
	out, rejected, err := a.reject(ctx, nil, next+1, cause)
	if err != nil {
		t.Fatal(err)
	}
	if rejected || len(out.rejected) != 0 {
		t.Fatalf("rejected %v although the failed message is not next", out.rejected)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message"); n != 0 {
		t.Fatalf("%d messages recorded as rejected, want none", n)
	}

	// The failure was on next: it alone is rejected, by seq, with its id.
	// A long reason in several-byte characters is cut as the column keeps
	// it, in the notice as in the poll.
	cause = errors.New("a refusal by MySQL: " + strings.Repeat("ü", 300))
	out, rejected, err = a.reject(ctx, nil, next, cause)
	if err != nil {
		t.Fatal(err)
	}
	if !rejected || out.fence != next || len(out.rejected) != 1 {
		t.Fatalf("rejected %v, fence %d; want exactly seq %d", out.rejected, out.fence, next)
	}
	r, ok, err := store.GetResult(ctx, e.db, good.RequestID)
	if err != nil || !ok {
		t.Fatalf("poll of the rejected request: found %v, err %v", ok, err)
	}
	if r.Outcome != wire.OutcomeRejected || r.Seq != next || r.Op != wire.OpJoin || r.ActivityID != 1 ||
		r.UserID != 1 || r.Reason == "" || r.State != wire.StateDone {
		t.Fatalf("poll of the rejected request: %+v", r)
	}
	if !utf8.ValidString(r.Reason) || !strings.HasPrefix(r.Reason, "cannot be applied: a refusal by MySQL: ü") {
		t.Fatalf("poll of the rejected request: reason %q", r.Reason)
	}
	if len(out.results) != 1 || out.results[0].RequestID != good.RequestID || out.results[0].Reason != r.Reason {
		t.Fatalf("waiting clients are told %+v, want the REJECTED result %+v", out.results, r)
	}
}
