package baseline

import (
	"sync"

	"github.com/allot-dev/allot/internal/wire"
)

// Floor is the least a claim can cost over HTTP: each item's stock counted
// in the server's memory under one mutex, and nothing stored anywhere. No
// one should run it (a restart forgets every sale, and a second server
// would sell the stock again); the end-to-end burst serves it beside allot
// and the Redis gate to show how much of a burst's time the HTTP serving
// and the load tool take before any design does its own work.
type Floor struct {
	mu    sync.Mutex
	items map[int64]*floorItem
}

type floorItem struct {
	capacity, remaining int64
	owners              map[int64]bool
}

// NewFloor returns a floor with no item set up.
func NewFloor() *Floor { return &Floor{items: make(map[int64]*floorItem)} }

// Set sets item up with n items and no owners, for a new run, and reports
// whether the item existed before.
func (f *Floor) Set(item, n int64) (existed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, existed = f.items[item]
	f.items[item] = &floorItem{capacity: n, remaining: n, owners: make(map[int64]bool)}
	return existed
}

// Claim decides a claim as SeedClaim does, in the same order: SOLD_OUT
// when no item is left (or the item was never set up), else ALREADY_OWNED
// when player owns one, else GRANTED.
func (f *Floor) Claim(item, player int64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	it := f.items[item]
	switch {
	case it == nil || it.remaining == 0:
		return string(wire.OutcomeSoldOut)
	case it.owners[player]:
		return string(wire.OutcomeAlreadyOwned)
	}
	it.remaining--
	it.owners[player] = true
	return string(wire.OutcomeGranted)
}

// State is item's stock, as StockState reads the seed tables; false when
// the item was never set up.
func (f *Floor) State(item int64) (State, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	it := f.items[item]
	if it == nil {
		return State{}, false
	}
	return State{ID: item, Capacity: it.capacity, Confirmed: it.capacity - it.remaining, Remaining: it.remaining}, true
}
