package wire

import (
	"strings"
	"time"
	"unicode/utf8"
)

// A Result has one shape wherever it travels: the allocator builds it once
// (allocation.ResultOf), publishes that value on ResultSubject, records it,
// and a read of the record gives it back equal; ingest answers with it as
// it comes. What a column cannot keep is settled when the result is built,
// never by a reader: times (Instant), the reason (CutReason) and the
// promoted users (SinglePromotion).

// Instant is t as a result carries it and MySQL's DATETIME(6) keeps it:
// UTC, in whole microseconds (cut, never rounded).
func Instant(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// MaxReasonLen is the most characters a result's reason has: the reason
// columns (processed_request, rejected_message) are VARCHAR(255).
const MaxReasonLen = 255

// CutReason is reason as a result carries it and its column keeps it:
// valid UTF-8 (a bad byte becomes "?"), at most MaxReasonLen characters.
func CutReason(reason string) string {
	reason = strings.ToValidUTF8(reason, "?")
	if utf8.RuneCountInString(reason) <= MaxReasonLen {
		return reason
	}
	return string([]rune(reason)[:MaxReasonLen])
}

// SinglePromotion reports whether a result of op names the user it
// promoted in PromotedUserID: a cancel, confirm or expire releases one
// seat, which goes to one waiter at most. An open (a resize up) lists the
// users it promoted in PromotedUserIDs. No other op promotes anybody.
func SinglePromotion(op Op) bool {
	return op == OpCancel || op == OpConfirm || op == OpExpire
}
