package ingest

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"hash"
	"sync"

	"github.com/google/uuid"
)

// DefaultIDSecret keys the request-id checksum when Options.IDSecret is
// empty. It is public on purpose: the checksum is not a security boundary
// (a request id grants nothing and reveals nothing), it only lets any ingest
// instance, after any restart, tell an id that ingest issued, which reads
// "pending" until it is applied, from a well-formed id that was never issued,
// which is a 404, without remembering every id it handed out. Deployments
// that want outsiders unable to mint "pending" ids set ALLOT_ID_SECRET, the
// same on every instance.
const DefaultIDSecret = "allot-ingest-request-id-checksum-v1"

// idIssuer mints and checks request ids: UUIDv7s whose last 4 bytes are a
// truncated HMAC-SHA256 of their first 12 bytes. The version nibble (byte 6)
// and the variant bits (byte 8) lie in the first 12 bytes, so the result is
// still a valid, time-ordered UUIDv7; it keeps 30 random bits besides the
// 48-bit millisecond time and the 12-bit sub-millisecond sequence.
type idIssuer struct {
	macs sync.Pool // hash.Hash, keyed HMAC-SHA256, Reset before use
}

func newIDIssuer(secret string) *idIssuer {
	if secret == "" {
		secret = DefaultIDSecret
	}
	key := []byte(secret)
	return &idIssuer{macs: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// sum writes the checksum of id[:12] into out.
func (g *idIssuer) sum(id *uuid.UUID, out []byte) {
	mac := g.macs.Get().(hash.Hash)
	mac.Reset()
	mac.Write(id[:12])
	var buf [sha256.Size]byte
	copy(out, mac.Sum(buf[:0])[:4])
	g.macs.Put(mac)
}

// New returns a fresh request id.
func (g *idIssuer) New() (uuid.UUID, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.Nil, fmt.Errorf("new request id: %w", err)
	}
	g.sum(&id, id[12:16])
	return id, nil
}

// Issued reports whether id carries a valid checksum: ingest minted it (with
// the same secret), so it exists in JetStream or its publish failed.
func (g *idIssuer) Issued(id uuid.UUID) bool {
	if id.Version() != 7 || id.Variant() != uuid.RFC4122 {
		return false
	}
	var want [4]byte
	g.sum(&id, want[:])
	return hmac.Equal(want[:], id[12:16])
}
