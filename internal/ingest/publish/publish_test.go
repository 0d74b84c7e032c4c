package publish

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestInProcessIsNotARefusal: the broker's "duplicate message id is in
// process" (10158) says a copy with this id is being stored, so it is
// never taken for "nothing was stored".
func TestInProcessIsNotARefusal(t *testing.T) {
	if !inProcess(&jetstream.APIError{ErrorCode: 10158}) || refused(&jetstream.APIError{ErrorCode: 10158}) {
		t.Fatal("10158 is taken for a refusal")
	}
}
