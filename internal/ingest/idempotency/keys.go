// Package idempotency binds an Idempotency-Key to the first write that
// used it, in the JetStream KV bucket ALLOT_IDEMPOTENCY: a repeat of the key
// gets the first write's request id and message back (and is never
// published as a second request), a use for another op or path is a 422.
package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/ingest/reply"
	"github.com/allot-dev/allot/internal/wire"
)

// Keys is the idempotency-key store of one ingest. It answers
// bus.ErrUnavailable until Bind gives it the bucket (Service.Start does).
type Keys struct {
	timeout time.Duration // bounds one read or write of the bucket
	mu      sync.Mutex
	kv      jetstream.KeyValue
}

// New returns Keys whose bucket reads and writes take at most timeout
// (ALLOT_INGEST_PUBLISH_TIMEOUT).
func New(timeout time.Duration) *Keys { return &Keys{timeout: timeout} }

// Bind gives k the bucket, once Start has checked it.
func (k *Keys) Bind(kv jetstream.KeyValue) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.kv = kv
}

func (k *Keys) bucket() jetstream.KeyValue {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.kv
}

// Scope is the scope of the caller's idempotency keys: its subject, or
// "" when authentication is off.
func Scope(ctx context.Context) string {
	id, _ := access.Caller(ctx)
	return id.Subject
}

// CanonicalPath is the path of a write, built from the parsed ids so that
// /v1/activities/007 and /v1/activities/7 are the same path.
func CanonicalPath(op wire.Op, activity, user int64) string {
	a := strconv.FormatInt(activity, 10)
	u := strconv.FormatInt(user, 10)
	switch op {
	case wire.OpOpen:
		return "/v1/activities/" + a
	case wire.OpClaim:
		return "/v1/activities/" + a + "/claims/" + u
	case wire.OpConfirm:
		return "/v1/activities/" + a + "/signups/" + u + "/confirm"
	default: // join and cancel share their path; the op tells them apart
		return "/v1/activities/" + a + "/signups/" + u
	}
}

// idemRecord is the value stored under an Idempotency-Key.
type idemRecord struct {
	RequestID string  `json:"request_id"`
	Op        wire.Op `json:"op"`
	Path      string  `json:"path"`
	Msg       []byte  `json:"msg"` // the request message exactly as first published
}

// Claim binds key to this write, or finds the write it is bound to. It
// returns the request id and message to publish, and repeat=true when they
// are an earlier write's; an *reply.InputError (422) when the key is bound to
// another op or path; bus.ErrUnavailable when the bucket does not answer. Keys are stored as hex(sha256(key)): any printable
// key becomes a valid KV key of fixed length. A non-empty scope (the
// caller's subject) is hashed in before the key, so that two callers' keys
// never meet: one cannot learn or replay another's request by guessing a
// key.
func (k *Keys) Claim(ctx context.Context, scope, key string, op wire.Op, path, id string, data []byte) (string, []byte, bool, error) {
	kv := k.bucket()
	if kv == nil {
		return "", nil, false, fmt.Errorf("%w: ingest is not started", bus.ErrUnavailable)
	}
	var sum [sha256.Size]byte
	if scope == "" {
		sum = sha256.Sum256([]byte(key)) // as before authentication existed
	} else {
		sum = sha256.Sum256([]byte("sub:" + scope + "\x00" + key))
	}
	name := hex.EncodeToString(sum[:])
	val, err := json.Marshal(idemRecord{RequestID: id, Op: op, Path: path, Msg: data})
	if err != nil {
		return "", nil, false, fmt.Errorf("encode idempotency record: %w", err)
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.timeout)
	defer cancel()
	// Create is atomic: of concurrent first uses, one wins and the others
	// read its record. A record that expires between Create and Get is
	// claimed again, hence the loop.
	for range 3 {
		_, err := kv.Create(kctx, name, val)
		if err == nil {
			return id, data, false, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", nil, false, fmt.Errorf("%w: create idempotency key: %w", bus.ErrUnavailable, err)
		}
		e, err := kv.Get(kctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return "", nil, false, fmt.Errorf("%w: read idempotency key: %w", bus.ErrUnavailable, err)
		}
		var old idemRecord
		if err := json.Unmarshal(e.Value(), &old); err != nil || old.RequestID == "" || len(old.Msg) == 0 {
			return "", nil, false, fmt.Errorf("%w: undecodable idempotency record %s: %v", bus.ErrUnavailable, name, err)
		}
		if old.Op != op || old.Path != path {
			return "", nil, false, &reply.InputError{Status: http.StatusUnprocessableEntity,
				Msg: "This Idempotency-Key was first used for " + string(old.Op) + " on " + old.Path +
					"; use a new key for another operation or path."}
		}
		return old.RequestID, old.Msg, true, nil
	}
	return "", nil, false, fmt.Errorf("%w: idempotency key %s keeps vanishing", bus.ErrUnavailable, name)
}
