// Package kafkaretry retries Kafka admin requests through the moments when
// a partition leader or group coordinator is moving or still loading, as
// right after a topic is created or a broker restarts.
package kafkaretry

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"
)

// transientErrors are the errors that asking again shortly cures.
var transientErrors = []kafka.Error{
	kafka.LeaderNotAvailable, kafka.NotLeaderForPartition, kafka.FencedLeaderEpoch, kafka.UnknownLeaderEpoch,
	kafka.OffsetNotAvailable, kafka.RequestTimedOut, kafka.NotController,
	kafka.NotCoordinatorForGroup, kafka.GroupCoordinatorNotAvailable, kafka.GroupLoadInProgress,
}

// Transient reports whether err (or an error it wraps) is a partition
// leader or group coordinator that is moving or still loading.
func Transient(err error) bool {
	for _, e := range transientErrors {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Do calls f until it succeeds, fails with an error that is not Transient,
// window has passed, or ctx is done; it returns f's last answer (or ctx's
// error).
func Do[T any](ctx context.Context, window time.Duration, f func() (T, error)) (T, error) {
	deadline := time.Now().Add(window)
	for {
		v, err := f()
		if err == nil || !Transient(err) || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
