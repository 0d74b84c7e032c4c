package bus

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Backoff of Retry: the first retry after RetryMin, doubling up to RetryMax.
const (
	RetryMin = 250 * time.Millisecond
	RetryMax = 5 * time.Second
)

// StartAttempt bounds one attempt of a binary's start-up against
// JetStream. It is short on purpose: an API request sent before a new
// cluster has elected its meta leader is never answered, so a long attempt
// only waits longer for nothing; what an attempt did (a stream created)
// stays done, and the next one goes on from there.
const StartAttempt = 5 * time.Second

// Retry runs fn until it succeeds, fails for a reason other than
// ErrUnavailable, or ctx ends, waiting with exponential backoff between
// attempts; each attempt gets at most attempt. It is how the binaries wait
// for JetStream at start: a cluster that has just formed (no meta leader
// yet, too few peers for an R3 stream) answers slowly or refuses for a
// while, and that is a reason to report not-ready and try again, not to
// exit. Each failure is logged with what was tried. It returns ctx's error
// when ctx ends first.
func Retry(ctx context.Context, log *slog.Logger, what string, attempt time.Duration, fn func(ctx context.Context) error) error {
	wait := RetryMin
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err := fn(actx)
		cancel()
		if err == nil {
			if n > 1 {
				log.InfoContext(ctx, what+": done after retries", slog.Int("attempts", n))
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, ErrUnavailable) {
			return err
		}
		log.WarnContext(ctx, what+": JetStream not ready, retrying", slog.Int("attempt", n),
			slog.Duration("next_in", wait), slog.Any("err", err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, RetryMax)
	}
}
