package audit

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// WriteText writes the report for a person: the counts, then OK or one line
// per divergence with its stream sequence, request_id, expected and actual.
// An audit of several shards writes each shard's report under a heading
// naming the shard and its partitions, then one line per shard and the
// verdict: OK, the number of divergences, or the shards not audited.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	if len(r.Shards) > 0 {
		r.writeShards(&b)
	} else {
		r.writeOne(&b)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeShards writes the report of several shards.
func (r Report) writeShards(b *strings.Builder) {
	fmt.Fprintf(b, "audit of %d shards: stream up to seq %d\n", len(r.Shards), r.LastSeq)
	var verdicts []string
	failed := 0
	for _, s := range r.Shards {
		parts := "no partition"
		if len(s.Partitions) > 0 {
			ps := make([]string, len(s.Partitions))
			for i, p := range s.Partitions {
				ps[i] = strconv.Itoa(p)
			}
			parts = "partitions " + strings.Join(ps, ", ")
		}
		fmt.Fprintf(b, "== shard %s (%s) ==\n", s.Shard, parts)
		switch {
		case s.Error != "":
			failed++
			fmt.Fprintf(b, "NOT AUDITED: %s\n", s.Error)
			verdicts = append(verdicts, s.Shard+" not audited")
		case len(s.Divergences) > 0:
			s.writeOne(b)
			verdicts = append(verdicts, fmt.Sprintf("%s %d divergence(s)", s.Shard, len(s.Divergences)))
		default:
			s.writeOne(b)
			verdicts = append(verdicts, s.Shard+" OK")
		}
	}
	fmt.Fprintf(b, "shards: %s\n", strings.Join(verdicts, ", "))
	switch {
	case failed > 0 && len(r.Divergences) > 0:
		fmt.Fprintf(b, "%d divergence(s); %d shard(s) not audited\n", len(r.Divergences), failed)
	case failed > 0:
		fmt.Fprintf(b, "%d shard(s) not audited\n", failed)
	case len(r.Divergences) > 0:
		fmt.Fprintf(b, "%d divergence(s)\n", len(r.Divergences))
	default:
		b.WriteString("OK\n")
	}
}

// writeOne writes the report of one database (or shard).
func (r Report) writeOne(b *strings.Builder) {
	fmt.Fprintf(b, "audit: stream up to seq %d, allocator fence %d", r.LastSeq, r.Fence)
	if r.WindowStart > 1 {
		fmt.Fprintf(b, ", compared from seq %d", r.WindowStart)
	}
	b.WriteByte('\n')
	for _, c := range r.Checkpoints {
		ok := "digest ok"
		if !c.DigestOK {
			ok = "DIGEST MISMATCH"
		}
		fmt.Fprintf(b, "from checkpoint:      partition %d at seq %d, taken %s (%d activities, %d signups, %s)\n",
			c.Partition, c.Seq, c.TakenAt.Format(time.RFC3339), c.Activities, c.Signups, ok)
	}
	if r.VerifiedFrom == 0 {
		b.WriteString("verified:             nothing (no request applied in range)\n")
	} else {
		fmt.Fprintf(b, "verified:             seq %d..%d\n", r.VerifiedFrom, r.VerifiedTo)
	}
	fmt.Fprintf(b, "activities checked:   %d\n", r.ActivitiesChecked)
	fmt.Fprintf(b, "requests replayed:    %d\n", r.Replayed)
	fmt.Fprintf(b, "messages replayed:    %d\n", r.Messages)
	fmt.Fprintf(b, "compared:             %d\n", r.Compared)
	fmt.Fprintf(b, "skipped (duplicates): %d\n", r.Skipped)
	fmt.Fprintf(b, "malformed:            %d\n", r.Malformed)
	fmt.Fprintf(b, "pending:              %d\n", r.Pending)
	if len(r.Divergences) == 0 {
		b.WriteString("OK\n")
	} else {
		for _, d := range r.Divergences {
			b.WriteString(d.String())
			b.WriteByte('\n')
		}
		fmt.Fprintf(b, "%d divergence(s)\n", len(r.Divergences))
	}
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
	if d.Shard != "" {
		fmt.Fprintf(&b, " shard %s", d.Shard)
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
