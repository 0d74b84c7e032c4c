package move

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/shards"
)

// DefaultLease is how long a run holds a move's record without renewing
// it, when Options.Lease is 0. The run renews it every third of that.
const DefaultLease = 15 * time.Second

// ErrLeased is what the error of a run refused because another run holds
// the move's lease is (errors.Is).
var ErrLeased = errors.New("move: another run holds the move's lease")

type leasedError string

func (e leasedError) Error() string        { return string(e) }
func (e leasedError) Is(target error) bool { return target == ErrLeased }

// errLeaseLost is the cause of a run's context ended because its lease
// could not be kept: another run took the record over, or it could not
// be renewed before it ended.
var errLeaseLost = errors.New("lost the move's lease")

// defaultOwner names a run: its process and host.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "an unknown host"
	}
	return fmt.Sprintf("pid %d on %s", os.Getpid(), host)
}

// lease is the duration of the run's lease.
func (m *mover) lease() time.Duration {
	if m.o.Lease > 0 {
		return m.o.Lease
	}
	return DefaultLease
}

// leased refuses the run when the record read holds a live lease: another
// run is moving the partition, or was killed less than a lease ago.
func (m *mover) leased(now time.Time) error {
	if m.rec.Owner == "" || !m.rec.LeaseUntil.After(now) {
		return nil
	}
	return leasedError(fmt.Sprintf("partition %d's move to %s is being run by %s, whose lease ends at %s (in %s): let it finish, or, if that run was killed, run this again once the lease has ended",
		m.o.Partition, m.rec.To, m.rec.Owner, m.rec.LeaseUntil.UTC().Format("15:04:05 MST"), m.rec.LeaseUntil.Sub(now).Round(100*time.Millisecond)))
}

// take puts the run's owner and a fresh lease on the record: created
// (create) or taken over from the revision read (the lease there has
// ended, or none was held). Of two runs taking it at once one wins; the
// other is refused as leased.
func (m *mover) take(ctx context.Context, create bool) error {
	m.rec.Owner = m.owner()
	m.rec.LeaseUntil = time.Now().Add(m.lease()).UTC()
	var err error
	if create {
		err = m.createRecord(ctx)
	} else {
		err = m.updateRecord(ctx, nil)
	}
	if err == nil {
		return nil
	}
	// Lost the race: say who won, when the record tells.
	if have, rerr := m.readRecord(ctx); rerr == nil && have {
		if lerr := m.leased(time.Now()); lerr != nil {
			return lerr
		}
	}
	return err
}

func (m *mover) owner() string {
	if m.o.Owner != "" {
		return m.o.Owner
	}
	return defaultOwner()
}

// holding runs fn while the run holds the record's lease: it renews it
// every third of its duration (a compare-and-set like every other change
// of the record) and ends fn's context when it cannot (another run took
// the record over, or the lease ran out unrenewed). When fn returns, the
// lease is given up on the record that remains (a move failed or stopped
// midway), so that the next run needs not wait for it to end.
func (m *mover) holding(ctx context.Context, fn func(context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.renew(ctx, cancel, stop)
	}()
	err := fn(ctx)
	close(stop)
	wg.Wait()
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, errLeaseLost) {
		err = cause
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	m.release(rctx)
	return err
}

// renew renews the lease until stop is closed or the record is deleted.
func (m *mover) renew(ctx context.Context, cancel context.CancelCauseFunc, stop chan struct{}) {
	every := m.lease() / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		if m.deleted {
			m.mu.Unlock()
			return
		}
		until := m.rec.LeaseUntil
		m.rec.LeaseUntil = time.Now().Add(m.lease()).UTC()
		err := m.writeLocked(ctx)
		if err != nil {
			m.rec.LeaseUntil = until
		}
		m.mu.Unlock()
		switch {
		case err == nil:
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound):
			cancel(fmt.Errorf("%w: the record of partition %d's move was changed by another run (its lease had ended unrenewed?): %w", errLeaseLost, m.o.Partition, err))
			return
		case !time.Now().Add(every / 2).Before(until):
			cancel(fmt.Errorf("%w: partition %d's move could not renew its lease in bucket %s before it ended, so another run may take over: %w", errLeaseLost, m.o.Partition, shards.Bucket, err))
			return
		}
	}
}

// release gives the lease up, unless the record is gone or another run's.
func (m *mover) release(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.deleted || m.rec.Owner == "" {
		return
	}
	owner, until := m.rec.Owner, m.rec.LeaseUntil
	m.rec.Owner, m.rec.LeaseUntil = "", time.Time{}
	if err := m.writeLocked(ctx); err != nil {
		m.rec.Owner, m.rec.LeaseUntil = owner, until
	}
}
