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
	var changed []*allocation.Activity
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
			// The cached states hold the rolled-back decision (the domain
			// decides in place, the states in changed too): reload them,
			// and let a rebuild publish the views.
			a.loop.cache.Purge()
			a.loop.waits.Purge()
			changed, a.loop.viewsStale = nil, true
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
		if !a.loop.viewsStale {
			changed = append(changed, one.out.changed...)
		}
	}
	d.out.changed = changed
	return nil
}
