package access

import (
	"sync"
	"time"
)

// userLimiter is a token bucket per user on writes: a scripted client
// hammering the API for one user gets 429s while everyone else is served.
// Memory stays bounded: buckets live in shards and idle ones (full again)
// are dropped when a shard grows past its share of maxUsers.
type userLimiter struct {
	rate   float64 // tokens per second
	burst  float64
	shards [64]userShard
	max    int // buckets per shard before idle ones are swept
}

type userShard struct {
	mu sync.Mutex
	m  map[int64]*userBucket
}

type userBucket struct {
	tokens float64
	last   time.Time
}

const maxUsers = 1 << 20

func newUserLimiter(rate float64, burst int) *userLimiter {
	l := &userLimiter{rate: rate, burst: float64(max(burst, 1)), max: maxUsers / 64}
	for i := range l.shards {
		l.shards[i].m = make(map[int64]*userBucket)
	}
	return l
}

// allow takes a token for user at now, or reports how long until one is due.
func (l *userLimiter) allow(user int64, now time.Time) (bool, time.Duration) {
	sh := &l.shards[uint64(user)%uint64(len(l.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := sh.m[user]
	if b == nil {
		if len(sh.m) >= l.max {
			l.sweep(sh, now)
		}
		b = &userBucket{tokens: l.burst, last: now}
		sh.m[user] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// peek reports whether user has a token at now without taking it, or how
// long until one is due.
func (l *userLimiter) peek(user int64, now time.Time) (bool, time.Duration) {
	sh := &l.shards[uint64(user)%uint64(len(l.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := sh.m[user]
	if b == nil {
		return true, 0
	}
	tokens := min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	if tokens >= 1 {
		return true, 0
	}
	return false, time.Duration((1 - tokens) / l.rate * float64(time.Second))
}

// sweep drops the buckets that have refilled: they hold no state worth
// keeping. If none has, the oldest half goes.
func (l *userLimiter) sweep(sh *userShard, now time.Time) {
	full := time.Duration(l.burst / l.rate * float64(time.Second))
	for u, b := range sh.m {
		if now.Sub(b.last) >= full {
			delete(sh.m, u)
		}
	}
	if len(sh.m) < l.max {
		return
	}
	n := 0
	for u := range sh.m {
		if n >= len(sh.m)/2 {
			break
		}
		delete(sh.m, u)
		n++
	}
}
