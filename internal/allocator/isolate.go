package allocator

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/store"
)

// decideEach decides the requests of one batch message whose transaction
// MySQL refused (isolation), one at a time, each behind a savepoint: a
// request whose writes MySQL refuses is rolled back to its savepoint and
// rejected alone at its place; the others stand, and the fence moves past
// the whole message.
func (a *Allocator) decideEach(ctx context.Context, tx *sql.Tx, d *decision) error {
	if err := store.InsertRejected(ctx, tx, d.rejected, d.now); err != nil { // refused as they were read
		return err
	}
	changed := map[int64]bool{}
	rolledBack := false
	for _, r := range d.reqs {
		if _, err := tx.ExecContext(ctx, "SAVEPOINT allot_request"); err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		one := &decision{now: d.now, out: outcome{rejected: d.out.rejected}, reqs: []valid{r}}
		// An earlier request of the batch may have the same id: look.
		err := a.decideAll(ctx, tx, one, txMode{checkDuplicates: true})
		if err != nil && store.Rejectable(err) {
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT allot_request"); rerr != nil {
				return fmt.Errorf("rollback to savepoint: %w", rerr)
			}
			// The cached states hold the rolled-back decision: reload.
			a.loop.cache.Purge()
			a.loop.waits.Purge()
			rolledBack = true
			row := store.RejectedRow{Seq: r.seq, Index: r.index, Subject: r.subject, Reason: "cannot be applied: " + err.Error(), Request: r.req}
			if err := store.InsertRejected(ctx, tx, []store.RejectedRow{row}, d.now); err != nil {
				return err
			}
			d.out.reject(row, false, d.now)
			continue
		}
		if err != nil {
			return err
		}
		d.out.results = append(d.out.results, one.out.results...)
		d.out.events += one.out.events
		d.out.refused += one.out.refused
		for _, act := range one.out.changed {
			changed[act.ID] = true
		}
	}
	return a.reloadChanged(ctx, tx, d, changed, rolledBack)
}

// reloadChanged sets the activities d changed, as they now are in the
// transaction: read again when a rollback to a savepoint may have left
// the states in hand ahead of MySQL (the domain decides in place).
func (a *Allocator) reloadChanged(ctx context.Context, tx *sql.Tx, d *decision, changed map[int64]bool, reload bool) error {
	ids := make([]int64, 0, len(changed))
	for id := range changed {
		ids = append(ids, id)
	}
	if reload {
		a.loop.cache.Purge()
		a.loop.waits.Purge()
	}
	locked, err := store.LockActivities(ctx, tx, ids)
	if err != nil {
		return err
	}
	d.out.changed = make([]*allocation.Activity, 0, len(ids))
	for _, id := range ids {
		act, err := a.activity(ctx, tx, id, locked)
		if err != nil {
			return err
		}
		if act != nil {
			d.out.changed = append(d.out.changed, act)
		}
	}
	return nil
}
