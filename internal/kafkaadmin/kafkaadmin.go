// Package kafkaadmin reads offsets from Kafka for the tools, the example
// and the tests: log offsets and a group's committed offsets, retried
// through the moments when a partition leader or group coordinator is
// moving or still loading (right after a topic is created, or while a
// broker restarts).
package kafkaadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// Window is how long the reads here keep asking while the error is
// Transient.
const Window = 30 * time.Second

// transientErrors are the errors that asking again shortly cures.
var transientErrors = []kafka.Error{
	kafka.LeaderNotAvailable, kafka.NotLeaderForPartition, kafka.FencedLeaderEpoch, kafka.UnknownLeaderEpoch,
	kafka.OffsetNotAvailable, kafka.RequestTimedOut, kafka.NotController, kafka.BrokerNotAvailable,
	kafka.NotCoordinatorForGroup, kafka.GroupCoordinatorNotAvailable, kafka.GroupLoadInProgress,
}

// Transient reports whether err (or an error it wraps) is a partition
// leader or group coordinator that is moving or still loading, or a
// broker that is not serving yet (as after a restart or a pause).
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

// ListOffsets lists offsets of topic's partitions (kafka.FirstOffsetOf,
// LastOffsetOf, TimeOffsetOf), by partition. An error on any partition, or
// a partition that does not answer, fails the call; Transient errors are
// retried for up to Window.
func ListOffsets(ctx context.Context, c *kafka.Client, topic string, reqs []kafka.OffsetRequest) (map[int]kafka.PartitionOffsets, error) {
	return Do(ctx, Window, func() (map[int]kafka.PartitionOffsets, error) {
		res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
		if err != nil {
			return nil, fmt.Errorf("list offsets of %s: %w", topic, err)
		}
		out := map[int]kafka.PartitionOffsets{}
		for _, p := range res.Topics[topic] {
			if p.Error != nil {
				return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, p.Partition, p.Error)
			}
			out[p.Partition] = p
		}
		for _, r := range reqs {
			if _, ok := out[r.Partition]; !ok {
				return nil, fmt.Errorf("list offsets of %s: partition %d did not answer", topic, r.Partition)
			}
		}
		return out, nil
	})
}

// EndOffsets returns the log-end offset of partitions 0..n-1 of topic.
func EndOffsets(ctx context.Context, c *kafka.Client, topic string, n int) (map[int]int64, error) {
	reqs := make([]kafka.OffsetRequest, n)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	res, err := ListOffsets(ctx, c, topic, reqs)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, n)
	for p, o := range res {
		out[p] = o.LastOffset
	}
	return out, nil
}

// Committed returns group's committed offset for partitions 0..n-1 of
// topic, -1 where it has committed none. A group that has committed
// nothing yet is "not found" on some brokers (franz-go's in-process one)
// and has no offsets on others: the same answer here. Transient errors are
// retried for up to Window.
func Committed(ctx context.Context, c *kafka.Client, group, topic string, n int) (map[int]int64, error) {
	ps := make([]int, n)
	none := make(map[int]int64, n)
	for p := range ps {
		ps[p], none[p] = p, -1
	}
	return Do(ctx, Window, func() (map[int]int64, error) {
		res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
		if err != nil {
			return nil, fmt.Errorf("committed offsets of %s: %w", group, err)
		}
		if errors.Is(res.Error, kafka.GroupIdNotFound) {
			return none, nil
		}
		if res.Error != nil {
			return nil, fmt.Errorf("committed offsets of %s: %w", group, res.Error)
		}
		out := make(map[int]int64, n)
		for _, p := range res.Topics[topic] {
			if errors.Is(p.Error, kafka.GroupIdNotFound) {
				return none, nil
			}
			if p.Error != nil {
				return nil, fmt.Errorf("committed offset of %s on %s/%d: %w", group, topic, p.Partition, p.Error)
			}
			out[p.Partition] = p.CommittedOffset
		}
		for p := range none {
			if _, ok := out[p]; !ok {
				out[p] = -1
			}
		}
		return out, nil
	})
}
