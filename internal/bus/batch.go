package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// MaxAtomicBatch is the most messages the server takes in one atomic batch
// (its default limit).
const MaxAtomicBatch = 1000

// Why PublishAtomic did not store a batch. On any of them nothing of the
// batch was stored, or it is unknown (no answer), and the caller publishes
// the messages one by one, which their ids make safe: a batch holding a
// duplicate is refused as a whole, and a copy published again is dropped
// by the stream's duplicate window.
var (
	// ErrAtomicUnsupported: the stream does not allow atomic publish, or
	// the server does not know atomic batches (it stored the messages one
	// by one and answered the last as a plain publish). Asking again will
	// not help.
	ErrAtomicUnsupported = errors.New("atomic batches are not supported here")
	// ErrAtomicRefused: the server refused this batch (a duplicate id in
	// it, say).
	ErrAtomicRefused = errors.New("the atomic batch was refused")
)

// errCodeAtomicPublishDisabled is JetStream's error code for a stream that
// does not allow atomic publish.
const errCodeAtomicPublishDisabled = 10174

// PublishAtomic stores msgs in stream as one JetStream atomic batch: all or
// nothing, with one fsync for the batch instead of one per message. Each
// message keeps its own Nats-Msg-Id (ids[i]); msgs are not modified. It
// returns the stream sequence of the first message (the others follow in
// order), or an error: ErrAtomicUnsupported, ErrAtomicRefused, or another
// (no answer, an answer that is not a batch's).
func PublishAtomic(nc *nats.Conn, stream string, msgs []*nats.Msg, ids []string, timeout time.Duration) (uint64, error) {
	n := len(msgs)
	if n == 0 || n > MaxAtomicBatch || len(ids) != n {
		return 0, fmt.Errorf("an atomic batch of %d messages and %d ids", n, len(ids))
	}
	batch := nuid.Next()
	var reply *nats.Msg
	for i, src := range msgs {
		m := &nats.Msg{Subject: src.Subject, Data: src.Data, Header: make(nats.Header, len(src.Header)+5)}
		for k, v := range src.Header {
			m.Header[k] = v
		}
		m.Header.Set(jetstream.MsgIDHeader, ids[i])
		m.Header.Set(jetstream.ExpectedStreamHeader, stream)
		m.Header.Set("Nats-Batch-Id", batch)
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		if i < n-1 {
			if err := nc.PublishMsg(m); err != nil {
				return 0, fmt.Errorf("atomic batch abandoned: %w", err) // nothing of it is stored
			}
			continue
		}
		m.Header.Set("Nats-Batch-Commit", "1")
		var err error
		if reply, err = nc.RequestMsg(m, timeout); err != nil {
			return 0, fmt.Errorf("no answer to the atomic batch's commit: %w", err)
		}
	}
	var ack struct {
		Seq   uint64 `json:"seq"`
		Batch string `json:"batch"`
		Count int    `json:"count"`
		Error *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &ack); err != nil {
		return 0, fmt.Errorf("the atomic batch's answer %q: %w", reply.Data, err)
	}
	switch {
	case ack.Error != nil && ack.Error.ErrCode == errCodeAtomicPublishDisabled:
		return 0, fmt.Errorf("%w: %s", ErrAtomicUnsupported, ack.Error.Description)
	case ack.Error != nil:
		return 0, fmt.Errorf("%w: %s", ErrAtomicRefused, ack.Error.Description)
	case ack.Count == 0 && ack.Batch == "":
		return 0, fmt.Errorf("%w: the server answered the batch as a plain publish", ErrAtomicUnsupported)
	case ack.Count != n || ack.Batch != batch || ack.Seq < uint64(n):
		return 0, fmt.Errorf("an unexpected answer to the atomic batch: %s", reply.Data)
	}
	return ack.Seq - uint64(n) + 1, nil
}
