// Package faults is allot's fault-injection suite. It holds only
// tests: they build the real binaries (cmd/allocator, cmd/ingest, internal/cmd/natsd)
// once, then run each scenario against real processes — a natsd JetStream
// server with its own store directory, one or two allocators, one ingest —
// and a fresh MariaDB database, drive a burst of mixed join / cancel / claim
// traffic over HTTP, inject a fault mid-burst (kill -9, SIGSTOP, a NATS
// restart, killed MySQL connections, poison messages, overload), let the
// system recover, and check that every acknowledged request was applied
// exactly once, that the invariants (docs/architecture.md) hold, that every committed
// change produced exactly one event, and that the audit replay agrees.
//
// Run it with
//
//	go test -count=1 -v ./internal/faults/
//
// Each scenario prints one summary line to stdout:
//
//	scenario 1 kill-allocator: sent=3000 accepted=2950 applied=2950 duplicated=0 lost=0 shed=50 rejected503=0 maybe503=0 rejected429=0 …
//
// duplicated counts doubled effects (dbtest.Effects): a second result row
// for a request cannot exist, a doubled signup history can. Every fault
// must show it took effect (a busy allocator killed, a takeover observed,
// a kill between commit and relay seen in the outbox backlog, the
// in-flight bound answering 503), or its scenario fails.
//
// -short skips the package. The binaries get the race detector when the
// tests run with it (go test -race); ALLOT_FAULTS_RACE=1 or 0 forces it
// on or off. MariaDB/MySQL must run at ALLOT_TEST_MYSQL_DSN (default
// root@127.0.0.1:3306), as for every other test; scenario 9 also runs a
// private server (mariadbd, or MySQL 8's mysqld), scenario 15 two of
// them as shards, and, on CI (CI=true), they fail rather than skip
// without one.
package faults
