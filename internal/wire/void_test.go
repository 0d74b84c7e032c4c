package wire

import (
	"testing"

	"github.com/google/uuid"
)

// TestIDPartitionField: the field names every partition of any count up to
// MaxIDPartitions whatever the random bits, and touches nothing but its
// 10 bits.
func TestIDPartitionField(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 16, 1000, MaxIDPartitions} {
		for p := range n {
			for _, r := range []int{0, 1, p, MaxIDPartitions - 1, (p * 7919) % MaxIDPartitions} {
				id := uuid.Must(uuid.NewV7())
				before := id
				SetIDPartition(&id, p, n, r)
				if got := PartitionOfID(id, n); got != p {
					t.Fatalf("n=%d p=%d r=%d: names %d", n, p, r, got)
				}
				if id[10]&^0x03 != before[10]&^0x03 || id.Version() != 7 || id.Variant() != uuid.RFC4122 {
					t.Fatalf("n=%d p=%d r=%d: bits outside the field changed", n, p, r)
				}
				for i := range 16 {
					if i != 10 && i != 11 && id[i] != before[i] {
						t.Fatalf("n=%d p=%d r=%d: byte %d changed", n, p, r, i)
					}
				}
			}
		}
	}
}
