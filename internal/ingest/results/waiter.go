// Package results finds a request's result for the handlers that wait for
// it (?wait=) and for polls: waiters woken by the allocator's result
// notifications (waiter.go) and the coalesced MySQL reads that back them
// up (reader.go). Results is the component.
package results

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/wire"
)

// Waiter is one HTTP handler waiting for one request's result.
type Waiter struct {
	ch chan wire.Result // buffered 1: delivery never blocks the subscription
}

// waiters maps request ids to the handlers waiting for them. It is fed by
// the subscription to wire.ResultSubject; every entry is removed by the
// handler that added it, whether or not a result came.
type waiters struct {
	mu    sync.Mutex
	m     map[string][]*Waiter
	n     atomic.Int64
	gauge prometheus.Gauge
}

func newWaiters(gauge prometheus.Gauge) *waiters {
	return &waiters{m: make(map[string][]*Waiter), gauge: gauge}
}

// add registers a waiter for id. The caller must call remove.
func (ws *waiters) add(id string) *Waiter {
	w := &Waiter{ch: make(chan wire.Result, 1)}
	ws.mu.Lock()
	ws.m[id] = append(ws.m[id], w)
	ws.mu.Unlock()
	ws.n.Add(1)
	ws.gauge.Inc()
	return w
}

// remove unregisters w.
func (ws *waiters) remove(id string, w *Waiter) {
	ws.mu.Lock()
	list := ws.m[id]
	for i, x := range list {
		if x == w {
			list[i] = list[len(list)-1]
			list[len(list)-1] = nil
			list = list[:len(list)-1]
			break
		}
	}
	if len(list) == 0 {
		delete(ws.m, id)
	} else {
		ws.m[id] = list
	}
	ws.mu.Unlock()
	ws.n.Add(-1)
	ws.gauge.Dec()
}

// count is the number of registered waiters.
func (ws *waiters) count() int64 { return ws.n.Load() }

// resultKey opens each result's request id in a result batch, as
// wire.Result.AppendJSON writes it.
var resultKey = []byte(`"request_id":"`)

// wants reports whether data, a result batch, may hold the result of a
// registered id. It reads the ids without decoding the batch; an id
// written with an escape, or a batch it cannot read, counts as wanted, so
// that the decoder decides.
func (ws *waiters) wants(data []byte) bool {
	if ws.count() == 0 {
		return false
	}
	for rest := data; ; {
		i := bytes.Index(rest, resultKey)
		if i < 0 {
			return false
		}
		rest = rest[i+len(resultKey):]
		j := bytes.IndexByte(rest, '"')
		if j < 0 || bytes.IndexByte(rest[:j], '\\') >= 0 {
			return true
		}
		ws.mu.Lock()
		_, ok := ws.m[string(rest[:j])]
		ws.mu.Unlock()
		if ok {
			return true
		}
		rest = rest[j+1:]
	}
}

// deliver wakes every waiter of r.RequestID.
func (ws *waiters) deliver(r wire.Result) {
	ws.mu.Lock()
	for _, w := range ws.m[r.RequestID] {
		select {
		case w.ch <- r:
		default: // already holds this result
		}
	}
	ws.mu.Unlock()
}

// OnBatch is the handler of wire.ResultSubject. Results are decoded only
// when one of them is waited for here: the allocator publishes a batch per
// commit whether or not anyone listens, and most results of a sale are of
// claims ingest has already answered.
func (rs *Results) OnBatch(m *nats.Msg) {
	hasViews := rs.onView != nil && bytes.Contains(m.Data, []byte(`"views"`))
	if !hasViews && !rs.waiters.wants(m.Data) {
		return
	}
	batch, err := wire.DecodeResultBatch(m.Data)
	if err != nil {
		rs.log.Warn("undecodable result batch", slog.String("subject", m.Subject), slog.Any("err", err))
		return
	}
	if hasViews {
		for _, v := range batch.Views {
			rs.onView(v)
		}
	}
	for i := range batch.Results {
		r := batch.Results[i]
		if r.RequestID == "" {
			continue
		}
		// The allocator sends the result a MySQL read gives back
		// (allocation.ResultOf): it is answered as it is.
		rs.waiters.deliver(r)
	}
}

// Await waits up to d for the result of id, registered as w before the
// request could have been applied (before publishing, or before the first
// MySQL read), so that no notification falls between a read and the
// registration. Core NATS may drop a notification, so MySQL is read again
// every RecheckInterval and once at the deadline. It returns found=false
// when the deadline passes, the client leaves or the service shuts down;
// those all answer "pending", which is true.
func (rs *Results) Await(ctx context.Context, id string, w *Waiter, d time.Duration, readFirst bool) (wire.Result, bool) {
	if readFirst {
		if r, ok := rs.Lookup(ctx, id); ok {
			return r, true
		}
	}
	r, ok, _ := rs.AwaitOr(ctx, id, w, d, nil)
	return r, ok
}

// AwaitOr is Await without the first read, which also returns, with woken
// true and no result, when wake closes first (a nil wake never does).
func (rs *Results) AwaitOr(ctx context.Context, id string, w *Waiter, d time.Duration, wake <-chan struct{}) (r wire.Result, found, woken bool) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	var tick <-chan time.Time
	if iv := rs.recheck; iv > 0 && iv < d {
		t := time.NewTicker(iv)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case r := <-w.ch:
			return r, true, false
		case <-wake:
			return wire.Result{}, false, true
		case <-tick:
			if r, ok := rs.Lookup(ctx, id); ok {
				return r, true, false
			}
		case <-deadline.C:
			select {
			case r := <-w.ch:
				return r, true, false
			default:
			}
			r, ok := rs.Lookup(ctx, id)
			return r, ok, false
		case <-ctx.Done():
			return wire.Result{}, false, false
		case <-rs.quit:
			return wire.Result{}, false, false
		}
	}
}

// Lookup reads id's result from MySQL; an error counts as "not yet", since
// a waiting handler answers "pending" rather than fail a request that is
// durably stored.
func (rs *Results) Lookup(ctx context.Context, id string) (wire.Result, bool) {
	r, ok, err := rs.Get(ctx, id)
	if err != nil {
		if ctx.Err() == nil {
			rs.log.WarnContext(ctx, "read result while waiting", slog.String("request_id", id), slog.Any("err", err))
		}
		return wire.Result{}, false
	}
	return r, ok
}
