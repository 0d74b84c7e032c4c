package access

import (
	"testing"
	"time"
)

func TestUserLimiterBucket(t *testing.T) {
	l := newUserLimiter(10, 3)
	now := time.Unix(1000, 0)
	for i := range 3 {
		if ok, _ := l.allow(7, now); !ok {
			t.Fatalf("write %d within the burst refused", i+1)
		}
	}
	ok, wait := l.allow(7, now)
	if ok || wait <= 0 || wait > 100*time.Millisecond {
		t.Fatalf("4th write at once: allowed %v, wait %s; want refused with a wait up to 100ms", ok, wait)
	}
	if ok, _ := l.allow(8, now); !ok {
		t.Fatal("another user was refused")
	}
	if ok, _ := l.allow(7, now.Add(100*time.Millisecond)); !ok {
		t.Fatal("a token due after 100ms was refused")
	}
}

func TestUserLimiterMemoryIsBounded(t *testing.T) {
	l := newUserLimiter(1, 1)
	l.max = 100 // per shard
	now := time.Unix(1000, 0)
	for u := int64(0); u < 100_000; u++ {
		l.allow(u, now)
	}
	total := 0
	for i := range l.shards {
		total += len(l.shards[i].m)
	}
	if total > 64*100 {
		t.Fatalf("%d buckets kept, want at most %d", total, 64*100)
	}
}
