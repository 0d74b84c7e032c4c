package bus

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// MaxAtomicBatch is the most messages the server takes in one atomic batch
// (its default limit).
const MaxAtomicBatch = 1000

// PublishAtomic stores msgs in stream as one JetStream atomic batch (the
// stream must allow atomic publish): all or nothing, with one fsync for
// the batch instead of one per message. Each message keeps its own
// Nats-Msg-Id (ids[i]). It reports whether the server stored the whole
// batch; on false nothing of it was stored, or it is unknown (no answer),
// and the caller publishes the messages one by one, which the ids make
// safe: a batch holding a duplicate is refused as a whole, and a copy
// published again is dropped by the stream's duplicate window.
func PublishAtomic(nc *nats.Conn, stream string, msgs []*nats.Msg, ids []string, timeout time.Duration) bool {
	n := len(msgs)
	if n == 0 || n > MaxAtomicBatch {
		return false
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
				return false // abandoned: nothing of it is stored
			}
			continue
		}
		m.Header.Set("Nats-Batch-Commit", "1")
		var err error
		if reply, err = nc.RequestMsg(m, timeout); err != nil {
			return false
		}
	}
	var ack struct {
		Seq   uint64          `json:"seq"`
		Batch string          `json:"batch"`
		Count int             `json:"count"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &ack); err != nil || len(ack.Error) > 0 {
		return false
	}
	// A server without atomic publish stores the messages one by one and
	// answers the last as a plain publish: not a batch's answer.
	return ack.Count == n && ack.Batch == batch && ack.Seq >= uint64(n)
}
