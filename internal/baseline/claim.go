package baseline

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

const errDuplicateKey = 1062

// errAlreadyOwned makes WithTx roll the claim back, decrement included.
var errAlreadyOwned = errors.New("already owned")

// SeedClaim is the seed flash sale's corrected claim, one transaction: the
// conditional UPDATE … SET remaining = remaining - 1 WHERE remaining > 0,
// whose affected rows say whether this request got an item (SOLD_OUT when
// none), then the INSERT into seed_inventory, whose UNIQUE (player_id,
// item_id) key turns a second claim into a rollback, the decrement
// included (ALREADY_OWNED). It answers GRANTED, SOLD_OUT or ALREADY_OWNED;
// an item that was never set up reads as SOLD_OUT, as in the seed design.
func SeedClaim(ctx context.Context, db *sql.DB, item, player int64) (string, error) {
	var outcome string
	err := store.WithTx(ctx, db, store.TxOptions{}, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx,
			"UPDATE seed_limited_stock SET remaining = remaining - 1 WHERE item_id = ? AND remaining > 0", item)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 0 {
			outcome = string(wire.OutcomeSoldOut)
			return nil
		}
		_, err = tx.ExecContext(ctx,
			"INSERT INTO seed_inventory (player_id, item_id, acquired_at) VALUES (?, ?, NOW(6))", player, item)
		if me, ok := errors.AsType[*mysql.MySQLError](err); ok && me.Number == errDuplicateKey {
			return errAlreadyOwned
		}
		if err != nil {
			return err
		}
		outcome = string(wire.OutcomeGranted)
		return nil
	})
	if errors.Is(err, errAlreadyOwned) {
		return string(wire.OutcomeAlreadyOwned), nil
	}
	if err != nil {
		return "", fmt.Errorf("seed claim: %w", err)
	}
	return outcome, nil
}

// Gate is the seed flash sale's Redis counter in front of the database: one key
// per item, namespaced per run so that runs never share a counter.
type Gate struct {
	redis *Redis
	ns    string

	mu   sync.Mutex
	keys map[string]struct{}
}

// gateTTL makes a forgotten counter expire; a run lasts minutes at most.
const gateTTL = 24 * time.Hour

// NewGate returns a gate whose keys live under namespace; an empty
// namespace gets a random one.
func NewGate(r *Redis, namespace string) *Gate {
	if namespace == "" {
		var b [6]byte
		rand.Read(b[:])
		namespace = hex.EncodeToString(b[:])
	}
	return &Gate{redis: r, ns: namespace, keys: make(map[string]struct{})}
}

// Key is the counter of item, as in the seed design's limited:{item}:left.
func (g *Gate) Key(item int64) string {
	return "allot:baseline:" + g.ns + ":limited:" + strconv.FormatInt(item, 10) + ":left"
}

// Set sets item's counter to n, for a new run.
func (g *Gate) Set(ctx context.Context, item, n int64) error {
	key := g.Key(item)
	if err := g.redis.Set(ctx, key, n, gateTTL); err != nil {
		return fmt.Errorf("gate set %s: %w", key, err)
	}
	g.mu.Lock()
	g.keys[key] = struct{}{}
	g.mu.Unlock()
	return nil
}

// Left reads item's counter without changing it (INCR by 0 is not in the
// gate's command set, so it is DECR then INCR; use it only when idle).
func (g *Gate) Left(ctx context.Context, item int64) (int64, error) {
	key := g.Key(item)
	if _, err := g.redis.Decr(ctx, key); err != nil {
		return 0, err
	}
	return g.redis.Incr(ctx, key)
}

// Close deletes the counters this gate set.
func (g *Gate) Close(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	for key := range g.keys {
		if _, err := g.redis.Del(ctx, key); err != nil {
			errs = append(errs, err)
		}
		delete(g.keys, key)
	}
	return errors.Join(errs...)
}

// GatedClaim is SeedClaim behind the gate: DECR the item's counter; below
// zero, INCR it back and answer SOLD_OUT without touching MySQL; else run
// SeedClaim, and give the slot back with INCR when it answers ALREADY_OWNED
// or fails. MySQL stays the source of truth: the gate only sheds load, so
// it can never oversell, but a slot held by a duplicate tap while others
// were turned away can leave the item undersold.
func GatedClaim(ctx context.Context, db *sql.DB, g *Gate, item, player int64) (string, error) {
	key := g.Key(item)
	left, err := g.redis.Decr(ctx, key)
	if err != nil {
		return "", fmt.Errorf("gated claim: %w", err)
	}
	if left < 0 {
		if _, err := g.redis.Incr(ctx, key); err != nil {
			return "", fmt.Errorf("gated claim: give back: %w", err)
		}
		return string(wire.OutcomeSoldOut), nil
	}
	outcome, err := SeedClaim(ctx, db, item, player)
	if err != nil || outcome == string(wire.OutcomeAlreadyOwned) {
		if _, ierr := g.redis.Incr(ctx, key); ierr != nil {
			return "", errors.Join(err, fmt.Errorf("gated claim: give back: %w", ierr))
		}
	}
	if err != nil {
		return "", fmt.Errorf("gated claim: %w", err)
	}
	return outcome, nil
}
