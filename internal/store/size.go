package store

import (
	"strings"
	"sync/atomic"
)

// packetBytes is the lowest max_allowed_packet of the servers Open has
// connected to: every statement allot sends must fit in it.
var packetBytes atomic.Int64

func notePacket(n int64) {
	for {
		old := packetBytes.Load()
		if n <= 0 || (old != 0 && old <= n) || packetBytes.CompareAndSwap(old, n) {
			return
		}
	}
}

// statementBytes bounds one multi-row statement: three quarters of the
// server's max_allowed_packet, leaving room for the statement's text and
// the protocol's framing.
func statementBytes() int {
	p := packetBytes.Load()
	if p <= 0 {
		p = 4 << 20 // MySQL's smallest default, until Open has asked
	}
	return int(max(p-p/4, 4<<10))
}

// maxPieceBytes bounds a piece of a long value: a row holds two of them
// (promoted_user_ids and events), each may double when escaped, and the
// row must fit in a statement, so an eighth of it; and at most 1 MiB, so
// that the relay and the poll read a long value a little at a time.
func maxPieceBytes() int {
	return min(statementBytes()/8, 1<<20)
}

// minPieceBytes is enough for any one encoded event ("kind:user_id").
const minPieceBytes = 64

// pieceBytes is n, or the default when n is 0, within the bounds above.
func pieceBytes(n int) int {
	if n <= 0 || n > maxPieceBytes() {
		n = maxPieceBytes()
	}
	return max(n, minPieceBytes)
}

// splitBytes cuts s into pieces of at most n bytes.
func splitBytes(s string, n int) []string {
	out := make([]string, 0, len(s)/n+1)
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// splitEvents cuts an encoded event list ("kind:id;kind:id") between two
// events into pieces of at most n bytes, and returns with each piece the
// index of its first event, which the relay needs for the event ids.
func splitEvents(s string, n int) (pieces []string, first []int) {
	event := 0
	for len(s) > n {
		cut := strings.LastIndexByte(s[:n+1], ';')
		if cut <= 0 {
			cut = strings.IndexByte(s, ';') // an entry longer than n: never from EncodeEvents
			if cut < 0 {
				break
			}
		}
		pieces, first = append(pieces, s[:cut]), append(first, event)
		event += strings.Count(s[:cut], ";") + 1
		s = s[cut+1:]
	}
	return append(pieces, s), append(first, event)
}

// argBytes is how many bytes a value takes in an interpolated statement,
// at worst (every byte of a string escaped).
func argBytes(v any) int {
	switch x := v.(type) {
	case string:
		return 2*len(x) + 3
	case []byte:
		return 2*len(x) + 3
	default:
		return 32
	}
}
