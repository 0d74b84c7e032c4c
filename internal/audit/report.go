package audit

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// WriteText writes the report for a person: the counts, then OK or one line
// per divergence with its stream sequence, request_id, expected and actual.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "audit: stream up to seq %d, allocator fence %d", r.LastSeq, r.Fence)
	if r.WindowStart > 1 {
		fmt.Fprintf(&b, ", compared from seq %d", r.WindowStart)
	}
	b.WriteByte('\n')
	for _, c := range r.Checkpoints {
		ok := "digest ok"
		if !c.DigestOK {
			ok = "DIGEST MISMATCH"
		}
		fmt.Fprintf(&b, "from checkpoint:      partition %d at seq %d, taken %s (%d activities, %d signups, %s)\n",
			c.Partition, c.Seq, c.TakenAt.Format(time.RFC3339), c.Activities, c.Signups, ok)
	}
	if r.VerifiedFrom == 0 {
		b.WriteString("verified:             nothing (no request applied in range)\n")
	} else {
		fmt.Fprintf(&b, "verified:             seq %d..%d\n", r.VerifiedFrom, r.VerifiedTo)
	}
	fmt.Fprintf(&b, "activities checked:   %d\n", r.ActivitiesChecked)
	fmt.Fprintf(&b, "requests replayed:    %d\n", r.Replayed)
	fmt.Fprintf(&b, "messages replayed:    %d\n", r.Messages)
	fmt.Fprintf(&b, "compared:             %d\n", r.Compared)
	fmt.Fprintf(&b, "skipped (duplicates): %d\n", r.Skipped)
	fmt.Fprintf(&b, "malformed:            %d\n", r.Malformed)
	fmt.Fprintf(&b, "pending:              %d\n", r.Pending)
	if len(r.Divergences) == 0 {
		b.WriteString("OK\n")
	} else {
		for _, d := range r.Divergences {
			b.WriteString(d.String())
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%d divergence(s)\n", len(r.Divergences))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// String is the divergence on one line: where (its place, "seq" or
// "seq#index" as wire.FormatPlace writes it, request_id, activity, user),
// what, expected vs actual, and why when there is more to say.
func (d Divergence) String() string {
	var b strings.Builder
	b.WriteString("DIVERGENCE seq ")
	if d.Seq == 0 {
		b.WriteString("-")
	} else {
		b.WriteString(wire.FormatPlace(d.Place()))
	}
	b.WriteString(" request_id ")
	if d.RequestID == "" {
		b.WriteString("-")
	} else {
		b.WriteString(d.RequestID)
	}
	if d.ActivityID != 0 {
		fmt.Fprintf(&b, " activity %d", d.ActivityID)
	}
	if d.UserID != 0 {
		fmt.Fprintf(&b, " user %d", d.UserID)
	}
	fmt.Fprintf(&b, ": %s", d.Kind)
	if d.Field != "" {
		fmt.Fprintf(&b, " %s", d.Field)
	}
	fmt.Fprintf(&b, ": expected %s, actual %s", d.Expected, d.Actual)
	if d.Detail != "" {
		fmt.Fprintf(&b, " (%s)", d.Detail)
	}
	return b.String()
}
