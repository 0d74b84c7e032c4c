package dbtest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// Effects replays the history every result row records in its events (the
// outbox), per activity and user in stream order, and returns each place
// where an effect shows up twice: a request applied twice, or its effects
// doubled, leaves traces no key of the schema forbids.
//
//   - signup history: a user who already holds a seat or waits is
//     confirmed, granted or waitlisted again; a user who does not wait is
//     promoted; a user with no live signup is cancelled; an activity is
//     opened twice;
//   - counters: an activity's confirmed_count differs from the seats its
//     history hands out;
//   - rows: a signup row's status differs from where the history leaves the
//     user.
//
// Only activities whose opening is in processed_request are judged, so
// tests that write rows by hand are left alone. The events on ALLOT_EVENTS
// are compared with this outbox by the tests that read the stream.
func (d *DB) Effects(ctx context.Context) ([]string, error) {
	const (
		none = iota
		waiting
		holding
		held // a seat under a hold, not yet confirmed
	)
	type key struct{ activity, user int64 }
	state := map[key]int{}
	opened := map[int64]bool{}
	var problems []string
	// One snapshot for every read: requests applied meanwhile would
	// otherwise show up as rows their results do not yet explain.
	tx, err := d.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("dbtest: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read only
	type result struct {
		seq               uint64
		index             int
		id, enc           string
		activityID        int64
		partition, pieces int
	}
	var results []result
	rows, err := tx.QueryContext(ctx, "SELECT seq, batch_index, request_id, activity_id, events, partition_id, event_parts FROM processed_request WHERE events IS NOT NULL ORDER BY seq, batch_index")
	if err != nil {
		return nil, fmt.Errorf("dbtest: read results: %w", err)
	}
	for rows.Next() {
		var r result
		if err := rows.Scan(&r.seq, &r.index, &r.id, &r.activityID, &r.enc, &r.partition, &r.pieces); err != nil {
			rows.Close()
			return nil, err
		}
		results = append(results, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, r := range results {
		seq, index, id, enc, activityID := r.seq, r.index, r.id, r.enc, r.activityID
		if r.pieces > 0 { // a long event list, stored in pieces
			if enc, err = store.WholeValue(ctx, tx, r.partition, seq, index, store.ColEvents, enc); err != nil {
				return nil, err
			}
		}
		evs, err := store.DecodeEvents(enc)
		if err != nil {
			return nil, fmt.Errorf("dbtest: request %s: %w", id, err)
		}
		for _, e := range evs {
			k := key{activityID, e.UserID}
			from := state[k]
			to, ok := from, true
			switch e.Kind {
			case wire.EventOpened:
				ok = !opened[activityID]
				opened[activityID] = true
			case wire.EventConfirmed:
				// A join that took a seat, or a hold confirmed.
				to, ok = holding, from == none || from == held
			case wire.EventGranted:
				to, ok = holding, from == none
			case wire.EventHeld:
				to, ok = held, from == none
			case wire.EventWaitlisted:
				to, ok = waiting, from == none
			case wire.EventPromoted:
				to, ok = holding, from == waiting
				if !e.HeldUntil.IsZero() {
					to = held
				}
			case wire.EventExpired:
				to, ok = none, from == held
			case wire.EventCancelled:
				to, ok = none, from != none
			}
			if !ok {
				problems = append(problems, fmt.Sprintf("seq %s request %s: event %s for user %d of activity %d, who is %s already",
					wire.FormatPlace(wire.Place(seq, index)), id, e.Kind, e.UserID, activityID, [...]string{"not signed up", "waiting", "holding a seat", "holding a seat under a hold"}[from]))
			}
			state[k] = to
		}
	}

	taken := map[int64]int64{}
	for k, s := range state {
		if s == holding || s == held {
			taken[k.activity]++
		}
	}
	acts, err := tx.QueryContext(ctx, "SELECT id, confirmed_count FROM activity")
	if err != nil {
		return nil, err
	}
	for acts.Next() {
		var id, confirmed int64
		if err := acts.Scan(&id, &confirmed); err != nil {
			acts.Close()
			return nil, err
		}
		if opened[id] && confirmed != taken[id] {
			problems = append(problems, fmt.Sprintf("activity %d: confirmed_count %d, its history hands out %d seats", id, confirmed, taken[id]))
		}
	}
	acts.Close()

	signups, err := tx.QueryContext(ctx, "SELECT activity_id, user_id, status FROM activity_signup")
	if err != nil {
		return nil, err
	}
	defer signups.Close()
	seen := map[key]bool{}
	for signups.Next() {
		var (
			k      key
			status string
		)
		if err := signups.Scan(&k.activity, &k.user, &status); err != nil {
			return nil, err
		}
		if !opened[k.activity] {
			continue
		}
		seen[k] = true
		want := map[int]wire.Status{none: wire.StatusCancelled, waiting: wire.StatusWaiting, holding: wire.StatusConfirmed, held: wire.StatusHeld}[state[k]]
		if wire.Status(status) != want {
			problems = append(problems, fmt.Sprintf("activity %d user %d: row %s, the history leaves %s", k.activity, k.user, status, want))
		}
	}
	for k, s := range state {
		if k.user != 0 && s != none && !seen[k] {
			problems = append(problems, fmt.Sprintf("activity %d user %d: no signup row, the history leaves a live signup", k.activity, k.user))
		}
	}
	return problems, signups.Err()
}

// CheckEffects fails t for every doubled effect Effects finds and returns
// how many there are.
func (d *DB) CheckEffects(t testing.TB) int {
	t.Helper()
	problems, err := d.Effects(context.Background())
	if err != nil {
		t.Fatalf("dbtest: effects: %v", err)
	}
	for i, p := range problems {
		if i == 10 {
			t.Errorf("… %d more doubled or unexplained effects", len(problems)-i)
			break
		}
		t.Errorf("effect applied twice or unexplained: %s", p)
	}
	return len(problems)
}
