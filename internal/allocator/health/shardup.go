package health

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ShardUp is the gauge allot_allocator_shard_up{shard}: 1 when the shard
// answers a ping, 0 when it does not (within 2s), for every shard of the
// process (default without ALLOT_MYSQL_SHARDS). The pings are taken at a
// scrape, all at once, and their answers kept for a second.
func (h *Health) ShardUp() prometheus.Collector {
	return &shardUp{h: h, desc: prometheus.NewDesc("allot_allocator_shard_up",
		"Whether the MySQL shard answers a ping (1) or not (0), by shard (ALLOT_MYSQL_SHARDS; default without it).",
		[]string{"shard"}, nil)}
}

type shardUp struct {
	h    *Health
	desc *prometheus.Desc
	mu   sync.Mutex
	at   time.Time // of the last pings
	down []string  // their answer
}

func (s *shardUp) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

func (s *shardUp) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.at) > time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.down = s.h.unreachable(ctx)
		cancel()
		s.at = time.Now()
	}
	for name := range s.h.dbs {
		up := 1.0
		if slices.Contains(s.down, name) {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, up, name)
	}
}
