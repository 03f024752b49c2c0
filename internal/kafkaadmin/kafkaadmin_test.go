package kafkaadmin

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestRetryWaitsOutLeaderMoves(t *testing.T) {
	calls := 0
	v, err := Do(context.Background(), time.Minute, func() (int, error) {
		calls++
		if calls < 3 {
			return 0, fmt.Errorf("list offsets of t/0: %w", kafka.NotLeaderForPartition)
		}
		return 42, nil
	})
	if err != nil || v != 42 || calls != 3 {
		t.Fatalf("got %d, %v after %d calls; want 42 after 3", v, err, calls)
	}
}

func TestRetryStopsAtOtherErrors(t *testing.T) {
	for _, want := range []error{kafka.UnknownTopicOrPartition, kafka.TopicAuthorizationFailed, errors.New("boom")} {
		calls := 0
		_, err := Do(context.Background(), time.Minute, func() (int, error) {
			calls++
			return 0, want
		})
		if !errors.Is(err, want) || calls != 1 {
			t.Errorf("%v: got %v after %d calls; want it at once", want, err, calls)
		}
	}
}

func TestRetryGivesUpAfterWindow(t *testing.T) {
	calls := 0
	_, err := Do(context.Background(), 250*time.Millisecond, func() (int, error) {
		calls++
		return 0, kafka.GroupLoadInProgress
	})
	if !errors.Is(err, kafka.GroupLoadInProgress) || calls < 2 || calls > 5 {
		t.Fatalf("got %v after %d calls; want the last error after 2 to 5", err, calls)
	}
}

func TestRetryStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, err := Do(ctx, time.Minute, func() (int, error) {
		calls++
		cancel()
		return 0, kafka.LeaderNotAvailable
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("got %v after %d calls; want context.Canceled after 1", err, calls)
	}
}
