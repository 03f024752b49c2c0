package replaycli

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
)

func TestRetryWaitsOutLeaderMoves(t *testing.T) {
	calls := 0
	v, err := retry(context.Background(), func() (int, error) {
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
	for _, want := range []error{errUnknownTopic, kafka.UnknownTopicOrPartition, kafka.TopicAuthorizationFailed, errors.New("boom")} {
		calls := 0
		_, err := retry(context.Background(), func() (int, error) {
			calls++
			return 0, want
		})
		if !errors.Is(err, want) || calls != 1 {
			t.Errorf("%v: got %v after %d calls; want it at once", want, err, calls)
		}
	}
}

func TestRetryStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, err := retry(ctx, func() (int, error) {
		calls++
		cancel()
		return 0, kafka.LeaderNotAvailable
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("got %v after %d calls; want context.Canceled after 1", err, calls)
	}
}
