package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// DecodeRequest parses and checks a request stored on subject. Any error
// makes the message malformed: the allocator terminates and records it and
// never applies it; the audit skips it the same way.
func DecodeRequest(subject string, data []byte) (Request, error) {
	var req Request
	// Unmarshal also refuses trailing data after the object.
	if err := unmarshalRequest(data, &req); err != nil {
		return req, fmt.Errorf("undecodable request: %v", err)
	}
	return checkRequest(subject, req)
}

// checkRequest checks a decoded request stored on subject (DecodeRequest).
func checkRequest(subject string, req Request) (Request, error) {
	id, err := uuid.Parse(req.RequestID)
	if err != nil || len(req.RequestID) != 36 || id.String() != strings.ToLower(req.RequestID) {
		return req, fmt.Errorf("request_id %q is not a canonical uuid", req.RequestID)
	}
	req.RequestID = id.String()
	if req.Op == OpVoid {
		// A void names no activity; its subject is its partition's carrier,
		// which bus.CheckRequestSubject checks against the partition count.
		if req.ActivityID != 0 || req.UserID < 0 || req.Capacity != nil || req.Hold != 0 || req.HoldSeq != 0 || req.HoldIndex != 0 || req.IdempotencyKey != "" {
			return req, errors.New("a void carries only request_id, user_id and received_at")
		}
		if _, err := strconv.ParseInt(ActivityOfSubject(subject), 10, 64); err != nil {
			return req, fmt.Errorf("void published on %s, not on a request subject", subject)
		}
		return req, nil
	}
	if req.ActivityID <= 0 {
		return req, fmt.Errorf("activity_id %d is not positive", req.ActivityID)
	}
	if ActivityOfSubject(subject) != strconv.FormatInt(req.ActivityID, 10) {
		return req, fmt.Errorf("activity_id %d was published on %s, not %s", req.ActivityID, subject, RequestSubject(req.ActivityID))
	}
	switch req.Op {
	case OpOpen:
		if req.UserID != 0 {
			return req, fmt.Errorf("open carries user_id %d, want 0", req.UserID)
		}
		if req.Capacity == nil || *req.Capacity < 0 || *req.Capacity > MaxCapacity {
			return req, errors.New("open needs a capacity between 0 and " + strconv.Itoa(MaxCapacity))
		}
		if req.Hold < 0 || time.Duration(req.Hold) > MaxHold {
			return req, fmt.Errorf("hold %s is outside 0 to %s", time.Duration(req.Hold), MaxHold)
		}
	case OpJoin, OpCancel, OpClaim, OpConfirm:
		if req.UserID <= 0 {
			return req, fmt.Errorf("%s needs a positive user_id, got %d", req.Op, req.UserID)
		}
	case OpExpire:
		if req.UserID <= 0 || req.HoldSeq == 0 || req.HoldSeq >= 1<<(64-IndexBits) || req.HoldIndex < 0 || req.HoldIndex >= MaxBatch {
			return req, fmt.Errorf("expire needs a positive user_id and a hold's place, got %d and %d#%d", req.UserID, req.HoldSeq, req.HoldIndex)
		}
	default:
		return req, fmt.Errorf("unknown op %q", req.Op)
	}
	return req, nil
}

// ActivityOfSubject returns the activity token of a stored request subject:
// alloc.req.<activity>, or alloc.req.<partition>.<activity> when the stream
// is partitioned. It returns "" for any other subject.
func ActivityOfSubject(subject string) string {
	rest, ok := strings.CutPrefix(subject, RequestSubjectPrefix)
	if !ok || rest == "" {
		return ""
	}
	part, act, two := strings.Cut(rest, ".")
	if !two {
		return rest
	}
	if part == "" || strings.Contains(act, ".") {
		return ""
	}
	return act
}
