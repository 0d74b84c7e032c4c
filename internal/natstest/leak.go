package natstest

import "go.uber.org/goleak"

// LeakOptions are for goleak in packages that run embedded servers: the
// goroutines nats-server itself leaves behind its Shutdown for a while.
// A stream that sources another (ALLOT_REQUESTS sources ALLOT_HOLDS) waits
// up to 30s for its source consumer to be created, in a goroutine that
// listens neither to the stream's nor to the server's end.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer.func3"),
	}
}
