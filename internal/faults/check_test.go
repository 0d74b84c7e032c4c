package faults

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// settleTimeout bounds the recovery after a burst: the allocator applies
// everything stored and the relay publishes every event.
const settleTimeout = 60 * time.Second

// settle waits until every partition's fence (allocator_partition.last_seq)
// has reached the last message of its share of the request stream, and
// every partition's outbox relay cursor (last_seq, last_index) covers its
// results' places. The fence, not a count of results: a message may hold
// only repeats (a request stored twice, in a batch whose PubAck was lost
// and alone), which leave no row at its seq.
func (s *stack) settle() {
	s.t.Helper()
	ctx := context.Background()
	err := poll(settleTimeout, "allocators and relays caught up with the stream", func() (bool, error) {
		st, err := s.js.Stream(ctx, wire.RequestStream)
		if err != nil {
			return false, err
		}
		fences, partitions, err := s.fences(ctx)
		if err != nil {
			return false, err
		}
		for p := range partitions {
			m, err := st.GetLastMsgForSubject(ctx, bus.PartitionFilter(p, partitions))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return false, err
			}
			if fences[p] < m.Sequence {
				return false, fmt.Errorf("partition %d applied up to seq %d of %d", p, fences[p], m.Sequence)
			}
		}
		for i, db := range s.dbs {
			var behind uint64
			err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM
			(SELECT partition_id, MAX(seq * 65536 + batch_index) AS last FROM processed_request GROUP BY partition_id) p
				LEFT JOIN event_relay r ON r.partition_id = p.partition_id
				WHERE r.last_seq IS NULL OR r.last_seq * 65536 + r.last_index < p.last`).Scan(&behind)
			if err != nil {
				return false, err
			}
			if behind > 0 {
				return false, fmt.Errorf("%d relay cursors behind on shard s%d", behind, i)
			}
		}
		return true, nil
	})
	if err != nil {
		s.t.Error(err)
	}
}

// fences reads each partition's fence and the number of partitions:
// with one database its allocator_partition rows; with shards, each
// partition's row on the shard the map names for it.
func (s *stack) fences(ctx context.Context) (map[int]uint64, int, error) {
	fences := map[int]uint64{}
	if len(s.dbs) < 2 {
		rows, err := s.db.QueryContext(ctx, "SELECT partition_id, last_seq FROM allocator_partition")
		if err != nil {
			return nil, 0, err
		}
		defer rows.Close()
		for rows.Next() {
			var p int
			var last uint64
			if err := rows.Scan(&p, &last); err != nil {
				return nil, 0, err
			}
			fences[p] = last
		}
		return fences, max(len(fences), 1), rows.Err()
	}
	places, err := s.placements(ctx)
	if err != nil {
		return nil, 0, err
	}
	for _, pl := range places {
		i, err := s.shardIndex(pl.Shard)
		if err != nil {
			return nil, 0, err
		}
		var last uint64
		err = s.dbs[i].QueryRowContext(ctx, "SELECT last_seq FROM allocator_partition WHERE partition_id = ?", pl.Partition).Scan(&last)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, 0, err
		}
		fences[pl.Partition] = last
	}
	return fences, len(places), nil
}

// placements reads the shard map.
func (s *stack) placements(ctx context.Context) ([]shards.Placement, error) {
	kv, err := s.js.KeyValue(ctx, shards.Bucket)
	if err != nil {
		return nil, err
	}
	return shards.Read(ctx, kv)
}

// shardIndex is the index in s.dbs of the shard named name (s0, s1, …).
func (s *stack) shardIndex(name string) (int, error) {
	var i int
	if _, err := fmt.Sscanf(name, "s%d", &i); err != nil || i < 0 || i >= len(s.dbs) {
		return 0, fmt.Errorf("shard %q is not one of the stack's %d", name, len(s.dbs))
	}
	return i, nil
}

// pools are the shards' pools by name, for the audit.
func (s *stack) pools() shards.Pools {
	p := shards.Pools{}
	for i, db := range s.dbs {
		p[fmt.Sprintf("s%d", i)] = db.DB
	}
	return p
}

// summary is what one scenario found; line() is the printed form.
type summary struct {
	n    int
	name string
	tally
	// maybeStored counts the 503s that named their request and whose
	// request was in fact stored and applied.
	maybeStored                      int
	applied, duplicated, lost, extra int
	// batched counts the results of requests that shared their message
	// with another (a request batch); extraBatched those among extra.
	batched, extraBatched int
	// mismatched counts 200 answers whose outcome or seq differ from the
	// recorded result.
	mismatched int
	events     int // distinct events on ALLOT_EVENTS
	eventsRaw  int // messages on ALLOT_EVENTS
	divergence int // audit divergences
	rejected   int // rejected_message rows
	notes      []string
	took       time.Duration
}

func (m summary) line() string {
	l := fmt.Sprintf("scenario %d %s: sent=%d accepted=%d applied=%d duplicated=%d lost=%d shed=%d rejected503=%d maybe503=%d rejected429=%d batched=%d"+
		" | done200=%d extra=%d mismatched=%d unexpected=%d errors=%d events=%d events_raw=%d rejected_msgs=%d audit_divergences=%d took=%s",
		m.n, m.name, m.sent, m.accepted, m.applied, m.duplicated, m.lost, m.shed, m.r503, m.maybe, m.r429, m.batched,
		m.done, m.extra, m.mismatched, m.unexpected, m.errs, m.events, m.eventsRaw, m.rejected, m.divergence,
		m.took.Round(100*time.Millisecond))
	if len(m.notes) > 0 {
		l += " " + strings.Join(m.notes, " ")
	}
	return l
}

// resultRow is the part of a processed_request row the checks need.
type resultRow struct {
	requestID  string
	seq        uint64
	index      int // batch_index: the place is (seq, index)
	activityID int64
	outcome    string
	events     string
}

// verify settles the system, then runs every check of the suite over the
// burst's answers (and the setup's) and returns the summary. wantRejected is
// the number of poison messages published straight to the stream.
func (s *stack) verify(n int, name string, answers []answer, wantRejected int, start time.Time) summary {
	s.t.Helper()
	s.settle()
	ctx := context.Background()
	all := append(slices.Clone(s.setup), answers...)
	sum := summary{n: n, name: name, tally: count(answers)}
	sum.tally.sent += len(s.setup)
	sum.tally.accepted += len(s.setup)
	sum.tally.done += len(s.setup)
	t := s.t

	// Every accepted request has exactly one result; nothing else has one.
	rows := s.results(ctx)
	byID := make(map[string]resultRow, len(rows))
	for _, r := range rows {
		if _, twice := byID[r.requestID]; twice {
			t.Errorf("request %s has a result on two shards (at seq %d)", r.requestID, r.seq)
		}
		byID[r.requestID] = r // unique on a shard: uk_processed_request
	}
	accepted := make(map[string]bool, len(all))
	var lostIDs []string
	for _, a := range all {
		if !a.accepted() {
			continue
		}
		if accepted[a.id] {
			t.Errorf("request_id %s was answered twice", a.id)
			continue
		}
		accepted[a.id] = true
		r, ok := byID[a.id]
		if !ok {
			sum.lost++
			lostIDs = append(lostIDs, a.id)
			continue
		}
		sum.applied++
		if a.code == 200 && (r.outcome != a.outcome || r.seq != a.seq) {
			sum.mismatched++
			t.Errorf("request %s: answered %s at seq %d, recorded %s at seq %d", a.id, a.outcome, a.seq, r.outcome, r.seq)
		}
	}
	// A 503 that named its request may or may not have stored it; either
	// is right, and a stored one is applied once (the unique key).
	maybe := make(map[string]bool)
	for _, a := range all {
		if a.maybe {
			maybe[a.id] = true
			if _, ok := byID[a.id]; ok {
				sum.maybeStored++
			}
		}
	}
	var extraIDs []string
	for id := range byID {
		if !accepted[id] && !maybe[id] {
			sum.extra++
			extraIDs = append(extraIDs, id)
		}
	}
	if sum.lost > 0 {
		t.Errorf("%d accepted requests have no result (lost), e.g. %v; %s", sum.lost, first(lostIDs, 5), s.rejectedSample(ctx))
	}
	// A request in flight when ingest was killed (its client saw a
	// transport error) may have been stored without its PubAck reaching
	// anyone: it is applied once, and its client never learns its id.
	unknown := 0
	if s.ingestKills > 0 {
		unknown = sum.errs
	}
	perSeq := make(map[uint64]int, len(rows))
	for _, r := range rows {
		perSeq[r.seq]++
	}
	for _, r := range rows {
		if perSeq[r.seq] > 1 {
			sum.batched++
		}
	}
	for _, id := range extraIDs {
		if perSeq[byID[id].seq] > 1 {
			sum.extraBatched++
		}
	}
	if sum.extra > unknown {
		var ds []string
		for _, id := range first(extraIDs, 5) {
			ds = append(ds, s.describe(ctx, byID[id]))
		}
		t.Errorf("%d results belong to no accepted request (stored although answered 503/429, or never sent): %s",
			sum.extra, strings.Join(ds, "; "))
	}
	if sum.errs > unknown || sum.unexpected > 0 {
		t.Errorf("%d transport errors and %d unexpected answers; first: %s", sum.errs, sum.unexpected, sum.firstUnexpected)
	}

	// The invariants (docs/architecture.md), in SQL, and doubled effects. A second
	// result row for a request cannot exist (a unique key), so what
	// "duplicated" counts is what applying a request twice would leave:
	// a signup history with an effect twice, counters and rows that
	// disagree with it. CheckInvariants reports each one.
	for _, db := range s.dbs {
		db.CheckInvariants(t)
		if problems, err := db.Effects(ctx); err != nil {
			t.Errorf("effects: %v", err)
		} else {
			sum.duplicated += len(problems)
		}
		sum.rejected += int(db.Count(t, "SELECT COUNT(*) FROM rejected_message"))
	}
	if sum.rejected != wantRejected {
		t.Errorf("rejected_message holds %d rows, want %d; %s", sum.rejected, wantRejected, s.rejectedSample(ctx))
	}

	// Every committed change produced exactly one event.
	sum.events, sum.eventsRaw = s.checkEvents(ctx, rows)

	// The audit replays the stream and agrees with MySQL.
	deps := audit.Deps{DB: s.db.DB, JS: s.js}
	if len(s.dbs) > 1 {
		deps = audit.Deps{Shards: s.pools(), JS: s.js}
	}
	rep, err := audit.Run(ctx, audit.Config{}, deps)
	if err != nil {
		t.Errorf("audit: %v", err)
	} else {
		sum.divergence = len(rep.Divergences)
		for i, d := range rep.Divergences {
			if i == 10 {
				t.Errorf("… %d more divergences", len(rep.Divergences)-i)
				break
			}
			t.Errorf("audit divergence: %+v", d)
		}
		if rep.Pending != 0 {
			t.Errorf("audit: %d requests pending after settling", rep.Pending)
		}
		if rep.Malformed != wantRejected {
			t.Errorf("audit: %d malformed messages, want %d", rep.Malformed, wantRejected)
		}
	}
	sum.took = time.Since(start)
	return sum
}

// results reads every processed_request row, of every shard.
func (s *stack) results(ctx context.Context) []resultRow {
	s.t.Helper()
	var rows []resultRow
	for _, db := range s.dbs {
		rows = append(rows, s.resultsOn(ctx, db)...)
	}
	sort.SliceStable(rows, func(i, j int) bool {
		return rows[i].seq < rows[j].seq || rows[i].seq == rows[j].seq && rows[i].index < rows[j].index
	})
	return rows
}

// resultsOn reads the processed_request rows of one database.
func (s *stack) resultsOn(ctx context.Context, db *dbtest.DB) []resultRow {
	s.t.Helper()
	q, err := db.QueryContext(ctx, "SELECT request_id, seq, batch_index, activity_id, outcome, COALESCE(events, '') FROM processed_request ORDER BY seq, batch_index")
	if err != nil {
		s.t.Fatal(err)
	}
	defer q.Close()
	var rows []resultRow
	for q.Next() {
		var r resultRow
		if err := q.Scan(&r.requestID, &r.seq, &r.index, &r.activityID, &r.outcome, &r.events); err != nil {
			s.t.Fatal(err)
		}
		rows = append(rows, r)
	}
	if err := q.Err(); err != nil {
		s.t.Fatal(err)
	}
	return rows
}

// describe tells where a result's request came from: its stream message.
func (s *stack) describe(ctx context.Context, r resultRow) string {
	st, err := s.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		return r.requestID + ": " + err.Error()
	}
	m, err := st.GetMsg(ctx, r.seq)
	if err != nil {
		return r.requestID + ": " + err.Error()
	}
	return fmt.Sprintf("%s at seq %d stored %s: %s", r.requestID, r.seq, m.Time.UTC().Format("15:04:05.000000"), m.Data)
}

// rejectedSample describes a few rejected_message rows, for error messages.
func (s *stack) rejectedSample(ctx context.Context) string {
	q, err := s.db.QueryContext(ctx, "SELECT seq, subject, reason FROM rejected_message ORDER BY seq LIMIT 5")
	if err != nil {
		return "rejected_message unreadable: " + err.Error()
	}
	defer q.Close()
	var out []string
	for q.Next() {
		var (
			seq             uint64
			subject, reason string
		)
		if q.Scan(&seq, &subject, &reason) == nil {
			out = append(out, fmt.Sprintf("seq %d on %s: %s", seq, subject, reason))
		}
	}
	if len(out) == 0 {
		return "rejected_message is empty"
	}
	return "rejected_message: " + strings.Join(out, "; ")
}

// checkEvents reads the whole event stream and compares it, deduplicated
// by event_id, with the events the results list: none missing, none extra,
// none published twice with different content. It returns the number of
// distinct events and of messages.
func (s *stack) checkEvents(ctx context.Context, rows []resultRow) (distinct, raw int) {
	s.t.Helper()
	t := s.t
	want := make(map[string]wire.Event)
	wantKinds := map[string]int{}
	for _, r := range rows {
		evs, err := store.DecodeEvents(r.events)
		if err != nil {
			t.Errorf("request %s: %v", r.requestID, err)
			continue
		}
		for i, e := range evs {
			id := wire.EventID(r.requestID, i)
			want[id] = wire.Event{EventID: id, Kind: e.Kind, ActivityID: r.activityID, UserID: e.UserID, RequestID: r.requestID, Seq: r.seq, Index: r.index}
			wantKinds[string(e.Kind)]++
		}
	}
	got, raw, err := s.readEvents(ctx)
	if err != nil {
		t.Errorf("read %s: %v", wire.EventStream, err)
		return 0, 0
	}
	seen := make(map[string]wire.Event, len(got))
	gotKinds := map[string]int{}
	var missing, extra, differ int
	for _, e := range got {
		if prev, ok := seen[e.EventID]; ok {
			if !sameEvent(prev, e) {
				differ++
				if differ <= 5 {
					t.Errorf("event %s published twice with different content: %+v and %+v", e.EventID, prev, e)
				}
			}
			continue
		}
		seen[e.EventID] = e
		gotKinds[string(e.Kind)]++
		w, ok := want[e.EventID]
		if !ok {
			extra++
			if extra <= 5 {
				t.Errorf("event %+v matches no recorded result", e)
			}
			continue
		}
		if w.Kind != e.Kind || w.ActivityID != e.ActivityID || w.UserID != e.UserID || w.RequestID != e.RequestID || w.Seq != e.Seq || w.Index != e.Index {
			differ++
			if differ <= 5 {
				t.Errorf("event %s is %+v, the result says %+v", e.EventID, e, w)
			}
		}
	}
	for id, w := range want {
		if _, ok := seen[id]; !ok {
			missing++
			if missing <= 5 {
				t.Errorf("event %+v missing from %s", w, wire.EventStream)
			}
		}
	}
	if missing+extra+differ > 0 {
		t.Errorf("events: %d missing, %d extra, %d differing; per kind recorded %v, published %v",
			missing, extra, differ, kinds(wantKinds), kinds(gotKinds))
	}
	return len(seen), raw
}

func sameEvent(a, b wire.Event) bool {
	return a.EventID == b.EventID && a.Kind == b.Kind && a.ActivityID == b.ActivityID && a.UserID == b.UserID &&
		a.RequestID == b.RequestID && a.Seq == b.Seq && a.Index == b.Index && a.At.Equal(b.At)
}

func kinds(m map[string]int) string {
	ks := make([]string, 0, len(m))
	for k, n := range m {
		ks = append(ks, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

// errEventsFinal marks a failure of readEvents that another read would
// not change: an event that breaks the format, or a read that stalled.
var errEventsFinal = errors.New("events")

// readEvents reads ALLOT_EVENTS from its first to its last message. A
// read that the broker could not serve (a cluster whose stream or
// ephemeral consumer has no leader yet after a node died or came back:
// "no responders", timeouts) is tried again from the start, within
// clusterTimeout; what the events hold is checked on every read.
func (s *stack) readEvents(ctx context.Context) ([]wire.Event, int, error) {
	deadline := time.Now().Add(clusterTimeout)
	for tries := 1; ; tries++ {
		out, raw, err := s.readEventsOnce(ctx)
		if err == nil || errors.Is(err, errEventsFinal) || ctx.Err() != nil {
			return out, raw, err
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("%d reads within %s, the last: %w", tries, clusterTimeout, err)
		}
		s.t.Logf("read %s (try %d): %v; trying again", wire.EventStream, tries, err)
		time.Sleep(250 * time.Millisecond)
	}
}

// readEventsOnce is one read of readEvents.
func (s *stack) readEventsOnce(ctx context.Context) ([]wire.Event, int, error) {
	st, err := s.js.Stream(ctx, wire.EventStream)
	if err != nil {
		return nil, 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil, 0, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, 0, err
	}
	var out []wire.Event
	raw := 0
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, 0, err
		}
		for m := range batch.Messages() {
			raw++
			var e wire.Event
			if err := json.Unmarshal(m.Data(), &e); err != nil {
				return nil, 0, fmt.Errorf("%w: event on %s is not JSON: %w", errEventsFinal, m.Subject(), err)
			}
			if want := wire.EventSubject(e.ActivityID, e.Kind); m.Subject() != want {
				return nil, 0, fmt.Errorf("%w: event %s on %s, want %s", errEventsFinal, e.EventID, m.Subject(), want)
			}
			if id := m.Headers().Get(jetstream.MsgIDHeader); id != e.EventID {
				return nil, 0, fmt.Errorf("%w: event %s carries Nats-Msg-Id %q", errEventsFinal, e.EventID, id)
			}
			out = append(out, e)
			md, err := m.Metadata()
			if err != nil {
				return nil, 0, err
			}
			if md.Sequence.Stream >= last {
				return out, raw, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, 0, err
		}
	}
	return nil, 0, fmt.Errorf("%w: read %d of %d messages within 30s", errEventsFinal, raw, info.State.Msgs)
}

func first(ids []string, n int) []string { return ids[:min(n, len(ids))] }

// report logs the summary line and prints it to stdout, the stable form
// scripts read.
func (s *stack) report(m summary) {
	s.t.Log(m.line())
	fmt.Println(m.line())
}
