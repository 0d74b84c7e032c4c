package baseline

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/allot-dev/allot/internal/store"
)

// DefaultMaxConns is the MySQL pool size of the baselines: the seed designs
// are measured with 64 connections.
const DefaultMaxConns = 64

// ErrNotFound is returned by the state reads when the activity or item was
// never set up.
var ErrNotFound = errors.New("baseline: no such activity or item")

// schema is the seed tables: seed_activity and seed_activity_signup as in
// the seed waitlist, seed_limited_stock and seed_inventory as in the seed flash sale
// (with its UNIQUE key and CHECK). seed_limited_stock.capacity is the one
// addition: it remembers the stock an item was set up with, for the state
// read; no claim touches it.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS seed_activity (
		id BIGINT PRIMARY KEY,
		capacity INT NOT NULL,
		confirmed_count INT NOT NULL DEFAULT 0,
		next_seq BIGINT NOT NULL DEFAULT 1,
		CHECK (capacity >= 0),
		CHECK (confirmed_count >= 0 AND confirmed_count <= capacity)
	) ENGINE=InnoDB`,
	`CREATE TABLE IF NOT EXISTS seed_activity_signup (
		id BIGINT PRIMARY KEY AUTO_INCREMENT,
		activity_id BIGINT NOT NULL,
		user_id BIGINT NOT NULL,
		status VARCHAR(16) NOT NULL,
		queue_seq BIGINT NOT NULL,
		UNIQUE KEY uk_activity_user (activity_id, user_id),
		UNIQUE KEY uk_activity_seq (activity_id, queue_seq),
		KEY idx_waiting (activity_id, status, queue_seq)
	) ENGINE=InnoDB`,
	`CREATE TABLE IF NOT EXISTS seed_limited_stock (
		item_id BIGINT PRIMARY KEY,
		capacity INT NOT NULL,
		remaining INT NOT NULL,
		CHECK (remaining >= 0)
	) ENGINE=InnoDB`,
	`CREATE TABLE IF NOT EXISTS seed_inventory (
		id BIGINT PRIMARY KEY AUTO_INCREMENT,
		player_id BIGINT NOT NULL,
		item_id BIGINT NOT NULL,
		acquired_at DATETIME(6) NOT NULL,
		UNIQUE KEY uq_inventory_player_limited (player_id, item_id)
	) ENGINE=InnoDB`,
}

// Migrate creates the seed tables if they do not exist.
func Migrate(ctx context.Context, db *sql.DB) error {
	for _, stmt := range schema {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("baseline migrate: %w", err)
		}
	}
	return nil
}

// Open connects to dsn with a pool of maxConns (DefaultMaxConns when 0) and
// creates the seed tables.
func Open(ctx context.Context, dsn string, maxConns int) (*sql.DB, error) {
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	if err := store.EnsureDatabase(ctx, dsn); err != nil {
		return nil, err
	}
	db, err := store.Open(ctx, dsn, maxConns)
	if err != nil {
		return nil, err
	}
	if err := Migrate(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// State is what GET /v1/activities/{a} shows, in allot's JSON shape.
type State struct {
	ID        int64 `json:"activity_id"`
	Capacity  int64 `json:"capacity"`
	Confirmed int64 `json:"confirmed"`
	Waiting   int64 `json:"waiting"`
	Remaining int64 `json:"remaining"`
}

// ResetStock sets item up with n items and no owners, for a new run. It
// reports whether the item existed before.
func ResetStock(ctx context.Context, db *sql.DB, item, n int64) (existed bool, err error) {
	err = store.WithTx(ctx, db, store.TxOptions{}, func(tx *sql.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, "SELECT 1 FROM seed_limited_stock WHERE item_id = ? FOR UPDATE", item).Scan(&one)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			existed = false
		case err != nil:
			return err
		default:
			existed = true
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM seed_inventory WHERE item_id = ?", item); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO seed_limited_stock (item_id, capacity, remaining) VALUES (?, ?, ?)
			ON DUPLICATE KEY UPDATE capacity = VALUES(capacity), remaining = VALUES(remaining)`, item, n, n)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("reset stock %d: %w", item, err)
	}
	return existed, nil
}

// ResetActivity sets activity up with capacity seats, no signups and fresh
// counters, for a new run. It reports whether the activity existed before.
func ResetActivity(ctx context.Context, db *sql.DB, activity, capacity int64) (existed bool, err error) {
	err = store.WithTx(ctx, db, store.TxOptions{}, func(tx *sql.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, "SELECT 1 FROM seed_activity WHERE id = ? FOR UPDATE", activity).Scan(&one)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			existed = false
		case err != nil:
			return err
		default:
			existed = true
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM seed_activity_signup WHERE activity_id = ?", activity); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO seed_activity (id, capacity, confirmed_count, next_seq) VALUES (?, ?, 0, 1)
			ON DUPLICATE KEY UPDATE capacity = VALUES(capacity), confirmed_count = 0, next_seq = 1`, activity, capacity)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("reset activity %d: %w", activity, err)
	}
	return existed, nil
}

// StockState reads item's stock: confirmed is the number of owners in
// seed_inventory, counted rather than derived from remaining, so that a
// reader sees when the two disagree.
func StockState(ctx context.Context, db store.DBTX, item int64) (State, error) {
	s := State{ID: item}
	err := db.QueryRowContext(ctx, "SELECT capacity, remaining FROM seed_limited_stock WHERE item_id = ?", item).
		Scan(&s.Capacity, &s.Remaining)
	if errors.Is(err, sql.ErrNoRows) {
		return s, ErrNotFound
	}
	if err != nil {
		return s, fmt.Errorf("stock state %d: %w", item, err)
	}
	err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM seed_inventory WHERE item_id = ?", item).Scan(&s.Confirmed)
	if err != nil {
		return s, fmt.Errorf("count owners %d: %w", item, err)
	}
	return s, nil
}

// ActivityState reads activity's counters and its number of waiters.
func ActivityState(ctx context.Context, db store.DBTX, activity int64) (State, error) {
	s := State{ID: activity}
	err := db.QueryRowContext(ctx, "SELECT capacity, confirmed_count FROM seed_activity WHERE id = ?", activity).
		Scan(&s.Capacity, &s.Confirmed)
	if errors.Is(err, sql.ErrNoRows) {
		return s, ErrNotFound
	}
	if err != nil {
		return s, fmt.Errorf("activity state %d: %w", activity, err)
	}
	err = db.QueryRowContext(ctx,
		"SELECT COUNT(*) FROM seed_activity_signup WHERE activity_id = ? AND status = 'WAITING'", activity).Scan(&s.Waiting)
	if err != nil {
		return s, fmt.Errorf("count waiting %d: %w", activity, err)
	}
	s.Remaining = s.Capacity - s.Confirmed
	return s, nil
}
