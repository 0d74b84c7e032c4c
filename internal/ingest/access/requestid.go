package access

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"sync"

	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/wire"
)

// DefaultIDSecret keys the request-id checksum when ALLOT_ID_SECRET is
// empty. It is public on purpose: the checksum is not a security boundary
// (a request id grants nothing and reveals nothing), it only lets any ingest
// instance, after any restart, tell an id that ingest issued, which reads
// "pending" until it is applied, from a well-formed id that was never issued,
// which is a 404, without remembering every id it handed out. Deployments
// that want outsiders unable to mint "pending" ids set ALLOT_ID_SECRET, the
// same on every instance.
const DefaultIDSecret = "allot-ingest-request-id-checksum-v1"

// IDIssuer mints and checks request ids: UUIDv7s whose last 4 bytes are
// two truncated HMAC-SHA256s of their first 12 bytes: bytes 12-13 say that
// ingest issued the id (Issued), bytes 14-15 bind it to the user the request
// is for (Owned; 0 for an open), so that a pending id another user asks
// about reads 404 like an id never issued, with no table of ids. The
// version nibble (byte 6) and the variant bits (byte 8) lie in the first 12
// bytes, so the result is still a valid, time-ordered UUIDv7. The id names
// the partition of its request (wire.SetIDPartition, in bytes 10-11), so
// that any ingest can settle it in its partition's order (publish.Publisher); it
// keeps 30 - log2(partitions) random bits besides the 48-bit millisecond
// time and the 12-bit sub-millisecond sequence (30 with one partition).
// Sixteen bits each are enough for what they guard: a guessed id reads
// "pending" instead of 404 once in 32,768 guesses (either kind of checksum
// below may match), and a user reads "pending" for another user's pending
// id (whose id they must already know) once in 65,536; a done result is
// checked against its recorded user_id exactly. Ids minted before ids named
// their partition carry checksums over bytes 0-11 alone; those minted since
// hash a 'p' after them, which is how the two kinds tell themselves apart
// (kind). Ids minted before the owner tag existed pass Issued, not Owned.
type IDIssuer struct {
	macs sync.Pool // hash.Hash, keyed HMAC-SHA256, Reset before use
}

// NewIDIssuer returns the issuer keyed by secret (ALLOT_ID_SECRET); empty:
// DefaultIDSecret.
func NewIDIssuer(secret string) *IDIssuer {
	if secret == "" {
		secret = DefaultIDSecret
	}
	key := []byte(secret)
	return &IDIssuer{macs: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// sum writes the issuer checksum of id[:12] into out[0:2] and the owner
// tag of id[:12] and owner into out[2:4]. named selects the checksum of ids
// that name their partition (wire.SetIDPartition): its input ends in a
// 'p', so the two kinds of ids tell themselves apart.
func (g *IDIssuer) sum(id *uuid.UUID, owner int64, named bool, out []byte) {
	mac := g.macs.Get().(hash.Hash)
	var buf [sha256.Size]byte
	mac.Reset()
	mac.Write(id[:12])
	if named {
		mac.Write([]byte{'p'})
	}
	copy(out[0:2], mac.Sum(buf[:0])[:2])
	mac.Reset()
	mac.Write(id[:12])
	if named {
		mac.Write([]byte{'p'})
	}
	var o [9]byte
	o[0] = 'o' // keeps the owner tag's input apart from the issuer checksum's
	binary.BigEndian.PutUint64(o[1:], uint64(owner))
	mac.Write(o[:])
	copy(out[2:4], mac.Sum(buf[:0])[:2])
	g.macs.Put(mac)
}

// New returns a fresh request id for a request of owner (the request's
// user_id) whose activity is in partition p of partitions.
func (g *IDIssuer) New(owner int64, p, partitions int) (uuid.UUID, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.Nil, fmt.Errorf("new request id: %w", err)
	}
	// The field's bits are random so far: they pick the value.
	wire.SetIDPartition(&id, p, partitions, wire.IDPartitionField(id))
	g.sum(&id, owner, true, id[12:16])
	return id, nil
}

// kind says which checksum id carries: 0 none (ingest never issued it),
// 1 that of an id minted before ids named their partition, 2 that of an id
// that names its partition.
func (g *IDIssuer) kind(id uuid.UUID) int {
	if id.Version() != 7 || id.Variant() != uuid.RFC4122 {
		return 0
	}
	var want [4]byte
	g.sum(&id, 0, true, want[:])
	if hmac.Equal(want[:2], id[12:14]) {
		return 2
	}
	g.sum(&id, 0, false, want[:])
	if hmac.Equal(want[:2], id[12:14]) {
		return 1
	}
	return 0
}

// Issued reports whether id carries a valid issuer checksum: ingest minted
// it (with the same secret), so it exists in JetStream or its publish
// failed. Either kind of id passes, so a guess passes once in 32,768.
func (g *IDIssuer) Issued(id uuid.UUID) bool { return g.kind(id) != 0 }

// Owned reports whether id was issued for a request of owner.
func (g *IDIssuer) Owned(id uuid.UUID, owner int64) bool {
	k := g.kind(id)
	if k == 0 {
		return false
	}
	var want [4]byte
	g.sum(&id, owner, k == 2, want[:])
	return hmac.Equal(want[2:], id[14:16])
}

// Partition returns the partition of partitions that issued id names, and
// false when it cannot tell: id was never issued, or it was minted before
// ids named their partition and the stream has several (with one, such an
// id is partition 0).
func (g *IDIssuer) Partition(id uuid.UUID, partitions int) (int, bool) {
	switch g.kind(id) {
	case 2:
		return wire.PartitionOfID(id, partitions), true
	case 1:
		return 0, partitions <= 1
	}
	return 0, false
}
