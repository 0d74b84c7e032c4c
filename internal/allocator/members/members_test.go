package members

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/natstest"
)

// TestMemberViewMerge: a member leaves the view when its key is deleted,
// or after missing from missesToLeave complete listings in a row; never
// after one; and a process always sees itself.
func TestMemberViewMerge(t *testing.T) {
	v := memberView{}
	steps := []struct {
		name    string
		listing map[string]bool
		want    []string
	}{
		{"both announce", map[string]bool{"a": true, "b": true}, []string{"a", "b"}},
		{"b missed once stays", map[string]bool{"a": true}, []string{"a", "b"}},
		{"b back resets its misses", map[string]bool{"a": true, "b": true}, []string{"a", "b"}},
		{"b missed once again", map[string]bool{"a": true}, []string{"a", "b"}},
		{"b missed twice leaves", map[string]bool{"a": true}, []string{"a"}},
		{"c joins", map[string]bool{"a": true, "c": true}, []string{"a", "c"}},
		{"c deleted leaves at once", map[string]bool{"a": true, "c": false}, []string{"a"}},
		{"self missing from the listing is still live", map[string]bool{"d": true}, []string{"a", "d"}},
		{"self deleted is still live", map[string]bool{"a": false, "d": true}, []string{"a", "d"}},
	}
	for _, s := range steps {
		if got := v.merge("a", s.listing); !slices.Equal(got, s.want) {
			t.Fatalf("%s: live = %v, want %v", s.name, got, s.want)
		}
	}
}

// TestMembersViewSurvivesSlowListings: refreshes whose deadline expires
// part-way through must never change who this process thinks is live.
// (A listing cut short used to be taken as the whole membership, so a
// process under load saw only the others, stopped pulling and let its
// partitions go.)
func TestMembersViewSurvivesSlowListings(t *testing.T) {
	t.Parallel()
	ms := threeMembers(t)
	ctx := context.Background()
	for _, m := range ms {
		if err := m.refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for _, m := range ms {
		want = append(want, m.ID())
	}
	slices.Sort(want)
	m := ms[0]
	if got := m.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("live = %v, want %v", got, want)
	}
	var failed int
	for i := range 400 {
		// Deadlines from nothing to a few hundred microseconds: many
		// expire before the Put, some during the listing.
		c, cancel := context.WithTimeout(ctx, time.Duration(i%40)*25*time.Microsecond)
		if m.refresh(c) != nil {
			failed++
		}
		cancel()
		if got := m.snapshot(); !slices.Equal(got, want) {
			t.Fatalf("refresh %d changed the view: live = %v, want %v", i, got, want)
		}
	}
	if failed == 0 {
		t.Fatal("no refresh ran out of time; the test proved nothing")
	}
	t.Logf("%d of 400 refreshes ran out of time; the view never changed", failed)
}

func (m *Members) snapshot() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Clone(m.live)
}

// TestGivenUpPartitionsGoToTheOthers: a member that gave a partition up
// is no longer its preferred owner in any member's view, every other
// partition stays where it was, and taking part again brings it back.
// When every member gave a partition up, it is assigned as if none had.
func TestGivenUpPartitionsGoToTheOthers(t *testing.T) {
	t.Parallel()
	ms := threeMembers(t)
	ctx := context.Background()
	const partitions = 6
	// Two rounds: in the first every member writes what it gave up (a
	// member listing before the next one wrote would see that one's old
	// value), in the second every member lists them all.
	refresh := func() {
		t.Helper()
		for range 2 {
			for _, m := range ms {
				if err := m.refresh(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// owners is each partition's preferred owner, the same in every view.
	owners := func() []*Members {
		t.Helper()
		out := make([]*Members, partitions)
		for p := range partitions {
			for _, m := range ms {
				if m.Prefers(p) {
					if out[p] != nil {
						t.Fatalf("partition %d preferred by two members", p)
					}
					out[p] = m
				}
			}
			if out[p] == nil {
				t.Fatalf("partition %d preferred by no member", p)
			}
		}
		return out
	}
	refresh()
	before := owners()
	owner := before[2]
	owner.GiveUp(2, true)
	refresh()
	after := owners()
	if after[2] == owner {
		t.Fatal("the member that gave partition 2 up still prefers it")
	}
	for p := range partitions {
		if p != 2 && after[p] != before[p] {
			t.Errorf("partition %d moved though nobody gave it up", p)
		}
	}
	for _, m := range ms {
		m.GiveUp(2, true)
	}
	refresh()
	if all := owners(); all[2] != before[2] {
		t.Error("a partition every member gave up is not assigned as if none had")
	}
	for _, m := range ms {
		m.GiveUp(2, false)
	}
	refresh()
	if back := owners(); !slices.Equal(back, before) {
		t.Error("taking part again did not bring the assignment back")
	}
}

// threeMembers joins three members to the setup step's bucket (keys that
// outlive the test) with a beat far longer than the test, so that only the
// refreshes a test makes run.
func threeMembers(t *testing.T) []*Members {
	t.Helper()
	ns := natstest.New(t)
	_, js := ns.Connect(t)
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	if _, err := js.CreateOrUpdateKeyValue(ctx, bus.MembersBucketConfig(1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	var ms []*Members
	for range 3 {
		m, err := Join(ctx, js, log, time.Hour, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		run(t, m)
		ms = append(ms, m)
	}
	return ms
}

// run runs m until the test ends.
func run(t *testing.T, m *Members) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx) //nolint:errcheck // it returns nil
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}
