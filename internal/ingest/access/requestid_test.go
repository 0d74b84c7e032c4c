package access

import (
	"testing"

	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/wire"
)

func TestRequestIDChecksum(t *testing.T) {
	t.Parallel()
	g := NewIDIssuer("")
	other := NewIDIssuer("another secret")
	const n = 1000
	foreign, stranger := 0, 0
	for i := range n {
		owner := int64(i + 1)
		id, err := g.New(owner, i%7, 7)
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := g.Partition(id, 7); !ok || p != i%7 {
			t.Fatalf("%s names partition %d (%v), want %d", id, p, ok, i%7)
		}
		if p := wire.PartitionOfID(id, 7); p != i%7 {
			t.Fatalf("%s: wire reads partition %d, want %d", id, p, i%7)
		}
		if id.Version() != 7 || id.Variant() != uuid.RFC4122 {
			t.Fatalf("%s: version %d variant %s, want 7 RFC4122", id, id.Version(), id.Variant())
		}
		if !g.Issued(id) || !g.Owned(id, owner) {
			t.Fatalf("%s: checksum or owner tag does not verify", id)
		}
		// 16-bit checks: a match by chance is 1 in 65,536.
		if other.Issued(id) {
			foreign++
		}
		if g.Owned(id, owner+1) {
			stranger++
		}
		for _, i := range []int{0, 7, 11, 12, 13} {
			bad := id
			bad[i] ^= 0x01
			if g.Issued(bad) && g.Owned(bad, owner) {
				t.Fatalf("%s with byte %d flipped still verifies", id, i)
			}
		}
		for _, i := range []int{14, 15} {
			bad := id
			bad[i] ^= 0x01
			if !g.Issued(bad) || g.Owned(bad, owner) {
				t.Fatalf("%s with owner byte %d flipped: issued %v (want true), owned %v (want false)", id, i, g.Issued(bad), g.Owned(bad, owner))
			}
		}
	}
	if foreign > 3 || stranger > 3 {
		t.Fatalf("of %d ids, %d verify under another secret and %d for another owner; want at most 3 each (1 in 65,536 by chance)", n, foreign, stranger)
	}
	if g.Issued(uuid.New()) {
		t.Fatal("a random v4 verifies")
	}
}

// TestRequestIDsMintedBeforePartitions: ids minted before ids named their
// partition still verify (issued, owned), and name partition 0 when the
// stream has one partition; with several, their partition is unknown.
func TestRequestIDsMintedBeforePartitions(t *testing.T) {
	t.Parallel()
	g := NewIDIssuer("")
	for owner := int64(1); owner <= 20; owner++ {
		id, err := uuid.NewV7()
		if err != nil {
			t.Fatal(err)
		}
		g.sum(&id, owner, false, id[12:16]) // as ingest minted ids before
		if !g.Issued(id) || !g.Owned(id, owner) {
			t.Fatalf("%s: an id of the earlier kind does not verify", id)
		}
		if p, ok := g.Partition(id, 1); !ok || p != 0 {
			t.Fatalf("%s: partition %d (%v) with one partition, want 0", id, p, ok)
		}
		if _, ok := g.Partition(id, 4); ok {
			t.Fatalf("%s: an id of the earlier kind claims a partition of 4", id)
		}
	}
}
