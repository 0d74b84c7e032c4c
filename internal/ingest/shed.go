package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/wire"
)

// Shedding: a claim for an activity the allocator reports full is decided
// here, at once, without touching the stream (write-up 003's "shed load
// before the database"). The allocator keeps a view of every full activity
// without waiters in the ALLOT_VIEW bucket: its counters and, up to
// wire.MaxViewHolders, every holder. Against that state a claim's decision
// is fixed: a holder gets ALREADY_OWNED, anyone else SOLD_OUT; nothing
// changes, so nothing needs to be stored. The allocator sends changed views
// on the result subject ahead of the results of the same commit, so this
// ingest applies a view before it hands out the results that depend on it
// (a result read from MySQL after a lost notification is the exception).

// shedView is the decoded view of one full activity.
type shedView struct {
	v       wire.View
	holders map[int64]struct{}
}

// shedOutcomes are encoded into a shed request id, so that a poll of it can
// answer without any stored state.
var shedOutcomes = []string{wire.OutcomeSoldOut, wire.OutcomeAlreadyOwned}

// views is ingest's copy of the ALLOT_VIEW bucket.
type views struct {
	mu sync.RWMutex
	m  map[int64]*shedView
}

func (vs *views) get(activity int64) *shedView {
	vs.mu.RLock()
	defer vs.mu.RUnlock()
	return vs.m[activity]
}

func (vs *views) apply(e jetstream.KeyValueEntry) error {
	id, err := strconv.ParseInt(strings.TrimPrefix(e.Key(), "a."), 10, 64)
	if err != nil {
		return errors.New("bad view key " + e.Key())
	}
	if e.Operation() != jetstream.KeyValuePut {
		// Deleting is always safe: without a view the claim goes through
		// the stream. A later put restores the view.
		vs.mu.Lock()
		delete(vs.m, id)
		vs.mu.Unlock()
		return nil
	}
	var v wire.View
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return err
	}
	vs.put(v)
	return nil
}

// put installs v unless a view of a later state is already installed. A
// view that cannot decide a claim removes the activity's.
func (vs *views) put(v wire.View) {
	var sv *shedView
	if v.Sheddable() {
		sv = &shedView{v: v, holders: make(map[int64]struct{}, len(v.Holders))}
		for _, u := range v.Holders {
			sv.holders[u] = struct{}{}
		}
	}
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if old := vs.m[v.ActivityID]; old != nil && old.v.Seq > v.Seq {
		return
	}
	if sv == nil {
		delete(vs.m, v.ActivityID)
		return
	}
	vs.m[v.ActivityID] = sv
}

// watchViews keeps s.views current until ctx ends.
func (s *Service) watchViews(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	go func() {
		defer w.Stop() //nolint:errcheck
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil { // the initial values are in
					continue
				}
				if err := s.views.apply(e); err != nil {
					s.log.Warn("view update", slog.String("key", e.Key()), slog.Any("err", err))
				}
			}
		}
	}()
	return nil
}

// shed answers a claim at once when the view of its activity decides it.
// It reports whether it answered.
func (s *Service) shed(w http.ResponseWriter, r *http.Request, activity, user int64) bool {
	sv := s.views.get(activity)
	if sv == nil {
		return false
	}
	res := wire.Result{State: wire.StateDone, Op: wire.OpClaim, ActivityID: activity, UserID: user,
		Outcome: wire.OutcomeSoldOut, Seq: sv.v.Seq, AppliedAt: time.Now().UTC().Truncate(time.Microsecond), Shed: true}
	if _, ok := sv.holders[user]; ok {
		st := wire.StatusConfirmed
		res.Outcome, res.Status = wire.OutcomeAlreadyOwned, &st
	}
	id, err := s.shedIDs.newShed(res.Outcome)
	if err != nil {
		return false
	}
	res.RequestID = id.String()
	s.metrics.shed.WithLabelValues(res.Outcome).Inc()
	writeJSON(w, http.StatusOK, res)
	return true
}

// newShed mints the id of a shed answer: a checksummed v7 (with the shed
// key) whose byte 7 carries the outcome.
func (g *idIssuer) newShed(outcome string) (uuid.UUID, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.Nil, err
	}
	for i, o := range shedOutcomes {
		if o == outcome {
			id[7] = byte(i)
		}
	}
	g.sum(&id, id[12:16])
	return id, nil
}

// shedResult is what a poll of a shed id answers: the outcome it carries.
// The activity and user are not in the id, so they are not in the answer.
func (g *idIssuer) shedResult(id uuid.UUID) (map[string]any, bool) {
	if !g.Issued(id) || int(id[7]) >= len(shedOutcomes) {
		return nil, false
	}
	return map[string]any{"request_id": id.String(), "state": wire.StateDone, "op": wire.OpClaim,
		"outcome": shedOutcomes[id[7]], "shed": true}, true
}
