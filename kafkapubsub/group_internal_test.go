package kafkapubsub

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// A fresh broker's coordinator is not there in the first seconds: that is
// said at INFO while it is retriable and the subscription is young, and at
// WARN after the grace period or for an error that retrying will not fix.
func TestJoinFailureLevel(t *testing.T) {
	for _, c := range []struct {
		err     error
		elapsed time.Duration
		want    slog.Level
	}{
		{kafka.GroupCoordinatorNotAvailable, time.Second, slog.LevelInfo},
		{fmt.Errorf("join: %w", kafka.GroupCoordinatorNotAvailable), time.Second, slog.LevelInfo},
		{kafka.GroupLoadInProgress, 5 * time.Second, slog.LevelInfo},
		{kafka.NotCoordinatorForGroup, 5 * time.Second, slog.LevelInfo},
		{kafka.GroupCoordinatorNotAvailable, coordinatorGrace, slog.LevelWarn},
		{kafka.GroupCoordinatorNotAvailable, 2 * time.Minute, slog.LevelWarn},
		{kafka.GroupAuthorizationFailed, time.Second, slog.LevelWarn},
		{kafka.InvalidGroupId, time.Second, slog.LevelWarn},
		{errors.New("dial tcp: connection refused"), time.Second, slog.LevelWarn},
	} {
		if got := joinFailureLevel(c.err, c.elapsed); got != c.want {
			t.Errorf("%v after %v: %v, want %v", c.err, c.elapsed, got, c.want)
		}
	}
}
