package wire

import (
	"github.com/google/uuid"
)

// Voids. A write whose PubAck never came may or may not be stored. Ingest
// settles such a request id for good with a void: a message in the request
// stream, in the order of the partition the id names, that carries only
// the id (op void, activity_id 0, the request's user when known). Its
// Nats-Msg-Id is the request id, so within the stream's duplicate window
// the broker keeps whichever of the original and the void came first and
// drops the other. After the window both may be stored; then the first in
// the partition's order wins: a void behind the original (applied or not
// yet) is a repeat and changes nothing, and a copy of the original behind
// a void is a repeat answered with the void's result, REJECTED with reason
// ReasonNeverStored. Either way an id has one answer.
//
// A void names no activity, so it is published on the subject of its
// partition's carrier (VoidCarrier in internal/bus): the smallest activity
// id the stream's partition transform sends to that partition. The
// allocator and the audit accept a void only on that subject.

// ReasonNeverStored is the reason of the result a void records.
const ReasonNeverStored = "never stored"

// Request ids name their partition. Ingest mints UUIDv7s whose bytes 12-15
// are two HMAC tags of bytes 0-11 (internal/ingest/access/requestid.go). Bytes
// 10-11 end in a 10-bit field v (the last 2 bits of byte 10 and byte 11)
// that ingest draws at random among the values with v mod partitions =
// the request's partition, so an id costs log2(partitions) random bits and
// nothing with one partition. The field lies in the tagged bytes, so it
// cannot be changed without the secret. Ids minted before the field existed
// carry random bits there; ingest tells them apart by their tag (only ingest
// has the secret) and treats them as partition 0 with one partition, as of
// unknown partition otherwise.

// MaxIDPartitions is the number of partitions the id field can name.
const MaxIDPartitions = 1 << 10

// IDPartitionField returns the 10-bit partition field of id.
func IDPartitionField(id uuid.UUID) int { return int(id[10]&0x03)<<8 | int(id[11]) }

// SetIDPartition sets the partition field of id to a value that names
// partition p of partitions, keeping as many of the field's random bits as
// possible (r is a random 10-bit value). It does not update any tag.
func SetIDPartition(id *uuid.UUID, p, partitions int, r int) {
	if partitions < 1 {
		partitions = 1
	}
	r &= MaxIDPartitions - 1
	v := r - r%partitions + p
	if v >= MaxIDPartitions {
		v -= partitions
	}
	id[10] = id[10]&^0x03 | byte(v>>8)
	id[11] = byte(v)
}

// PartitionOfID is the partition a request id names when the stream has
// partitions partitions: the field modulo partitions (0 with one). It does
// not tell an id minted before the field existed; ingest does.
func PartitionOfID(id uuid.UUID, partitions int) int {
	if partitions <= 1 {
		return 0
	}
	return IDPartitionField(id) % partitions
}
