package bus

import (
	"testing"

	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/wire"
)

// TestVoidSubjects: a void is accepted only on the carrier subject of the
// partition its request id names; every partition has a carrier the
// stream's transform sends to it.
func TestVoidSubjects(t *testing.T) {
	for _, partitions := range []int{1, 2, 7, 1024} {
		for p := range min(partitions, 64) {
			c := VoidCarrier(p, partitions)
			if got := PartitionOf(c, partitions); got != p {
				t.Fatalf("%d partitions: the carrier %d of partition %d is in partition %d", partitions, c, p, got)
			}
			id := uuid.Must(uuid.NewV7())
			wire.SetIDPartition(&id, p, partitions, wire.IDPartitionField(id))
			v := wire.Request{RequestID: id.String(), Op: wire.OpVoid}
			if err := CheckRequestSubject(StoredSubject(c, partitions), v, partitions); err != nil {
				t.Fatalf("%d partitions, partition %d: %v", partitions, p, err)
			}
			if partitions > 1 {
				other := VoidCarrier((p+1)%partitions, partitions)
				if err := CheckRequestSubject(StoredSubject(other, partitions), v, partitions); err == nil {
					t.Fatalf("%d partitions: the void of partition %d accepted on partition %d's carrier", partitions, p, (p+1)%partitions)
				}
			}
		}
	}
}
