package results

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// resultReader coalesces the MySQL reads of results. Every waiting handler
// reads MySQL now and then in case a notification was dropped; ten
// thousand of them reading one by one would take every connection of the
// pool and starve everything else. Reads asked for while others are in
// flight are gathered and done as one query per readBatch ids, at most
// readConns queries at a time.
type resultReader struct {
	db      *sql.DB
	timeout time.Duration
	running atomic.Bool

	mu      sync.Mutex
	pending map[string][]chan readAnswer
	kick    chan struct{}
	sem     chan struct{}
	stopped chan struct{} // closed when run ends
	queries func()        // counts a query; may be nil
}

// Bounds of the coalesced reads.
const (
	readBatch = 500
	readConns = 2
)

type readAnswer struct {
	r   wire.Result
	ok  bool
	err error
}

func newResultReader(db *sql.DB, timeout time.Duration, queries func()) *resultReader {
	return &resultReader{db: db, timeout: timeout, pending: make(map[string][]chan readAnswer),
		kick: make(chan struct{}, 1), sem: make(chan struct{}, readConns), stopped: make(chan struct{}), queries: queries}
}

// get reads id's result, joining whatever read is gathered next.
func (rr *resultReader) get(ctx context.Context, id string) (wire.Result, bool, error) {
	if !rr.running.Load() {
		qctx, cancel := context.WithTimeout(ctx, rr.timeout)
		defer cancel()
		return store.GetResult(qctx, rr.db, id)
	}
	ch := make(chan readAnswer, 1)
	rr.mu.Lock()
	rr.pending[id] = append(rr.pending[id], ch)
	rr.mu.Unlock()
	select {
	case rr.kick <- struct{}{}:
	default:
	}
	select {
	case a := <-ch:
		return a.r, a.ok, a.err
	case <-ctx.Done():
		return wire.Result{}, false, ctx.Err()
	case <-rr.stopped:
		return wire.Result{}, false, errReaderStopped
	}
}

// errReaderStopped answers the reads still waiting when the service stops.
var errReaderStopped = errors.New("ingest is stopping")

// run serves the reads until ctx ends.
func (rr *resultReader) run(ctx context.Context) {
	rr.running.Store(true)
	go func() {
		defer close(rr.stopped)
		defer rr.running.Store(false)
		for {
			select {
			case <-rr.kick:
			case <-ctx.Done():
				return
			}
			for {
				select {
				case rr.sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				batch := rr.take()
				if len(batch) == 0 {
					<-rr.sem
					break
				}
				go func() {
					defer func() { <-rr.sem }()
					rr.read(batch)
				}()
			}
		}
	}()
}

// take removes up to readBatch pending ids with their waiters.
func (rr *resultReader) take() map[string][]chan readAnswer {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	batch := make(map[string][]chan readAnswer, min(len(rr.pending), readBatch))
	for id, chs := range rr.pending {
		if len(batch) == readBatch {
			break
		}
		batch[id] = chs
		delete(rr.pending, id)
	}
	return batch
}

func (rr *resultReader) read(batch map[string][]chan readAnswer) {
	ids := make([]string, 0, len(batch))
	for id := range batch {
		ids = append(ids, id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rr.timeout)
	defer cancel()
	if rr.queries != nil {
		rr.queries()
	}
	found, err := store.GetResults(ctx, rr.db, ids)
	for id, chs := range batch {
		r, ok := found[id]
		for _, ch := range chs {
			ch <- readAnswer{r: r, ok: ok, err: err}
		}
	}
}
