package baseline

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// seedActivity is the activity row read under its lock.
type seedActivity struct {
	capacity, confirmed, nextSeq int64
}

// lockActivity is the seed waitlist's lockActivity: every write path takes the
// activity row's lock first, which serialises the writes of one activity.
func lockActivity(ctx context.Context, tx *sql.Tx, activity int64) (seedActivity, bool, error) {
	var a seedActivity
	err := tx.QueryRowContext(ctx,
		"SELECT capacity, confirmed_count, next_seq FROM seed_activity WHERE id = ? FOR UPDATE", activity).
		Scan(&a.capacity, &a.confirmed, &a.nextSeq)
	if errors.Is(err, sql.ErrNoRows) {
		return a, false, nil
	}
	return a, err == nil, err
}

// findSignup is the seed waitlist's findSignup (a plain read: the activity lock
// already serialises every writer of this activity's signups).
func findSignup(ctx context.Context, tx *sql.Tx, activity, user int64) (id int64, status string, found bool, err error) {
	err = tx.QueryRowContext(ctx,
		"SELECT id, status FROM seed_activity_signup WHERE activity_id = ? AND user_id = ?", activity, user).
		Scan(&id, &status)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", false, nil
	}
	return id, status, err == nil, err
}

// SeedJoin is the seed waitlist's join, one transaction: lock the activity row
// with SELECT … FOR UPDATE, return the live signup unchanged if there is
// one, else insert (or revive a CANCELLED row) as CONFIRMED when a seat is
// free or WAITING otherwise, with queue_seq = next_seq, and update the
// counters. It answers allot's outcome words: CONFIRMED, WAITING,
// ALREADY_CONFIRMED, ALREADY_WAITING, or NO_SUCH_ACTIVITY where the
// seed design throws.
func SeedJoin(ctx context.Context, db *sql.DB, activity, user int64) (string, error) {
	var outcome string
	err := store.WithTx(ctx, db, store.TxOptions{}, func(tx *sql.Tx) error {
		a, ok, err := lockActivity(ctx, tx, activity)
		if err != nil {
			return err
		}
		if !ok {
			outcome = string(wire.OutcomeNoSuchActivity)
			return nil
		}
		id, prev, found, err := findSignup(ctx, tx, activity, user)
		if err != nil {
			return err
		}
		if found && prev != string(wire.StatusCancelled) {
			outcome = alreadyOutcome(prev)
			return nil
		}
		seq := a.nextSeq
		hasSeat := a.confirmed < a.capacity
		status, add := string(wire.StatusWaiting), 0
		if hasSeat {
			status, add = string(wire.StatusConfirmed), 1
		}
		if !found {
			_, err = tx.ExecContext(ctx,
				"INSERT INTO seed_activity_signup (activity_id, user_id, status, queue_seq) VALUES (?, ?, ?, ?)",
				activity, user, status, seq)
		} else {
			_, err = tx.ExecContext(ctx,
				"UPDATE seed_activity_signup SET status = ?, queue_seq = ? WHERE id = ? AND status = 'CANCELLED'",
				status, seq, id)
		}
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx,
			"UPDATE seed_activity SET next_seq = next_seq + 1, confirmed_count = confirmed_count + ? WHERE id = ?",
			add, activity)
		if err != nil {
			return err
		}
		outcome = status // CONFIRMED and WAITING are both statuses and outcomes
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("seed join: %w", err)
	}
	return outcome, nil
}

func alreadyOutcome(status string) string {
	if status == string(wire.StatusConfirmed) {
		return string(wire.OutcomeAlreadyConfirmed)
	}
	return string(wire.OutcomeAlreadyWaiting)
}

// SeedCancel is the seed waitlist's cancel, one transaction: lock the activity
// row, mark the signup CANCELLED and, when it held a seat, promote the head
// of the waitlist (ORDER BY queue_seq LIMIT 1 FOR UPDATE) or free the seat.
// It answers CANCELLED with the promoted user (0 when none), NOT_SIGNED_UP,
// or NO_SUCH_ACTIVITY.
func SeedCancel(ctx context.Context, db *sql.DB, activity, user int64) (outcome string, promoted int64, err error) {
	err = store.WithTx(ctx, db, store.TxOptions{}, func(tx *sql.Tx) error {
		promoted = 0
		_, ok, err := lockActivity(ctx, tx, activity)
		if err != nil {
			return err
		}
		if !ok {
			outcome = string(wire.OutcomeNoSuchActivity)
			return nil
		}
		id, status, found, err := findSignup(ctx, tx, activity, user)
		if err != nil {
			return err
		}
		if !found || status == string(wire.StatusCancelled) {
			outcome = string(wire.OutcomeNotSignedUp)
			return nil
		}
		if _, err := tx.ExecContext(ctx, "UPDATE seed_activity_signup SET status = 'CANCELLED' WHERE id = ?", id); err != nil {
			return err
		}
		outcome = string(wire.OutcomeCancelled)
		if status == string(wire.StatusWaiting) {
			return nil
		}
		var headID, headUser int64
		err = tx.QueryRowContext(ctx, `SELECT id, user_id FROM seed_activity_signup
			WHERE activity_id = ? AND status = 'WAITING' ORDER BY queue_seq LIMIT 1 FOR UPDATE`, activity).
			Scan(&headID, &headUser)
		if errors.Is(err, sql.ErrNoRows) {
			_, err = tx.ExecContext(ctx, "UPDATE seed_activity SET confirmed_count = confirmed_count - 1 WHERE id = ?", activity)
			return err
		}
		if err != nil {
			return err
		}
		// One out, one in: confirmed_count is unchanged.
		if _, err := tx.ExecContext(ctx,
			"UPDATE seed_activity_signup SET status = 'CONFIRMED' WHERE id = ? AND status = 'WAITING'", headID); err != nil {
			return err
		}
		promoted = headUser
		return nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("seed cancel: %w", err)
	}
	return outcome, promoted, nil
}
