package audit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// idleLimit bounds the wait for the next message of a replay whose messages
// are known to be stored: longer means the server stopped answering.
const idleLimit = 15 * time.Second

// stream is the request stream as the audit saw it when it started.
type stream struct {
	js         jetstream.JetStream
	last       uint64
	partitions int // ALLOT_PARTITIONS the stream was created with
}

// openStream checks that the request stream still holds everything from
// sequence 1 up to the fence and returns its last sequence.
func openStream(ctx context.Context, js jetstream.JetStream, fence uint64) (stream, error) {
	st, err := js.Stream(ctx, wire.RequestStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return stream{}, fmt.Errorf("%w: stream %s does not exist on this NATS server (wrong ALLOT_NATS_URL?)", ErrIncompleteStream, wire.RequestStream)
	}
	if err != nil {
		return stream{}, fmt.Errorf("%w: stream %s: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return stream{}, fmt.Errorf("%w: stream %s info: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	s := info.State
	switch {
	case s.LastSeq > 0 && s.FirstSeq > 1:
		return stream{}, fmt.Errorf("%w: %s starts at sequence %d, not 1: older requests were removed (retention), so the state cannot be replayed from the start; -from-checkpoint verifies from the allocator's checkpoints",
			ErrIncompleteStream, wire.RequestStream, s.FirstSeq)
	case s.NumDeleted > 0:
		return stream{}, fmt.Errorf("%w: %s has %d deleted messages, so the state cannot be replayed",
			ErrIncompleteStream, wire.RequestStream, s.NumDeleted)
	case fence > s.LastSeq:
		return stream{}, fmt.Errorf("%w: the allocator's fence %d is beyond %s's last sequence %d (purged or recreated stream?)",
			ErrIncompleteStream, fence, wire.RequestStream, s.LastSeq)
	}
	return stream{js: js, last: s.LastSeq, partitions: max(bus.PartitionsOf(info.Config), 1)}, nil
}

// replay reads the stream in order from sequence 1 up to its last sequence
// at start and hands each message to the auditor.
func (a *auditor) replay(ctx context.Context, st stream) error {
	if st.last == 0 {
		return nil
	}
	filters := []string{wire.RequestSubjectPrefix + ">"}
	switch {
	case len(a.run.activities) > 0:
		filters = filters[:0]
		for _, id := range a.run.activities {
			if !a.partAudited(a.activityPartition(id)) {
				continue
			}
			// Stored as published, or behind its partition's token.
			filters = append(filters, subjectOf(id), wire.RequestSubjectPrefix+"*."+strconv.FormatInt(id, 10))
		}
	case a.run.parts != nil && st.partitions > 1:
		filters = filters[:0]
		for _, p := range a.run.partList {
			filters = append(filters, bus.PartitionFilter(p, st.partitions))
		}
	case a.run.parts != nil && !a.run.parts[0]:
		filters = nil
	}
	if len(filters) == 0 {
		return nil // nothing of the stream is audited here
	}
	occ := jetstream.OrderedConsumerConfig{
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if a.cp != nil && a.cp.min > 0 {
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, a.cp.min+1
	}
	cons, err := st.js.OrderedConsumer(ctx, wire.RequestStream, occ)
	if err != nil {
		return fmt.Errorf("%w: ordered consumer on %s: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(4096))
	if err != nil {
		return fmt.Errorf("%w: read %s: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	defer func() {
		iter.Stop()
		// Best effort: the server would drop the ephemeral consumer after
		// its inactivity threshold anyway, but repeated audits should not
		// pile them up meanwhile.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			st.js.DeleteConsumer(dctx, wire.RequestStream, info.Name) //nolint:errcheck
			cancel()
		}
	}()
	// The filters may match nothing at all; then no message will ever
	// tell us we are done.
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		return nil
	}
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			iter.Stop()
		case <-stopped:
		}
	}()

	var bar *progressbar.ProgressBar
	if a.run.progress != nil {
		bar = progressbar.NewOptions64(int64(st.last),
			progressbar.OptionSetWriter(a.run.progress),
			progressbar.OptionSetDescription("replaying "+wire.RequestStream),
			progressbar.OptionShowCount(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
		defer bar.Finish() //nolint:errcheck // cosmetic
	}

	var seq uint64
	for n := 0; ; n++ {
		msg, err := iter.Next(jetstream.NextMaxWait(idleLimit))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, nats.ErrTimeout) {
				return fmt.Errorf("%w: no message from %s for %s after sequence %d of %d", bus.ErrUnavailable, wire.RequestStream, idleLimit, seq, st.last)
			}
			return fmt.Errorf("%w: read %s after sequence %d: %w", bus.ErrUnavailable, wire.RequestStream, seq, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("%w: read %s: message without metadata: %w", bus.ErrUnavailable, wire.RequestStream, err)
		}
		seq = md.Sequence.Stream
		if seq > st.last {
			// Stored after the audit started: not part of this snapshot.
			return nil
		}
		// The ordered consumer delivers each message's headers with it: a
		// batch is told by its BatchHeader.
		if err := a.message(seq, msg.Subject(), msg.Headers().Get(wire.BatchHeader), msg.Data(), md.Timestamp); err != nil {
			return err
		}
		if bar != nil && n%512 == 0 {
			bar.Set64(int64(seq)) //nolint:errcheck // cosmetic
		}
		// NumPending counts the matching messages stored after this one:
		// zero means nothing up to the snapshot bound is left either.
		if seq == st.last || md.NumPending == 0 {
			if bar != nil {
				bar.Set64(int64(st.last)) //nolint:errcheck // cosmetic
			}
			return nil
		}
	}
}
