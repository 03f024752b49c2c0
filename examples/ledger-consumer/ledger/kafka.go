package ledger

// The demo's and verify's Kafka chores: topics made and removed, offsets
// read.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/kafkapubsub"
)

// createTopics makes the demo's topics with their partitions.
func createTopics(ctx context.Context, brokers []string, topics map[string]int) error {
	specs := make([]kafkapubsub.TopicSpec, 0, len(topics))
	for t, n := range topics {
		specs = append(specs, kafkapubsub.TopicSpec{Name: t, Partitions: n, ReplicationFactor: 1})
	}
	return kafkapubsub.CreateTopics(ctx, brokers, kafkapubsub.Security{}, specs...)
}

// removeDemo deletes the demo's topics and consumer groups from a real
// broker; a failure is logged, not fatal.
func removeDemo(ctx context.Context, brokers []string, log *slog.Logger, topics, groups []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	if res, err := c.DeleteGroups(ctx, &kafka.DeleteGroupsRequest{GroupIDs: groups}); err != nil {
		log.Warn("ledger: delete the demo's consumer groups", "groups", groups, "err", err)
	} else {
		for g, err := range res.Errors {
			if err != nil && !errors.Is(err, kafka.GroupIdNotFound) {
				log.Warn("ledger: delete the demo's consumer group", "group", g, "err", err)
			}
		}
	}
	res, err := c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
	if err != nil {
		log.Warn("ledger: delete the demo's topics", "topics", topics, "err", err)
		return
	}
	for t, err := range res.Errors {
		if err != nil {
			log.Warn("ledger: delete the demo's topic", "topic", t, "err", err)
		}
	}
}

// waitCaughtUp polls the group's committed offsets until they reach the
// topic's end, printing progress. The topic is complete before the worker
// starts, so its end offsets are read once.
// errWorkerStopped: waitCaughtUp saw the worker return (it read done).
var errWorkerStopped = errors.New("ledger: worker stopped early")

func waitCaughtUp(ctx context.Context, brokers []string, group, topic string, w *Worker, progress io.Writer, total int, done <-chan error) error {
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil {
		return fmt.Errorf("ledger: metadata of %s: %v %v", topic, err, md)
	}
	n := len(md.Topics[0].Partitions)
	end, err := endOffsets(ctx, c, topic, n)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Now()
	deadline := time.Now().Add(10 * time.Minute)
	var behind, consumed int64
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			return fmt.Errorf("%w: %v", errWorkerStopped, err)
		case <-tick.C:
		}
		if got, err := committed(ctx, c, group, topic, n); err == nil {
			behind, consumed = 0, 0
			for p, last := range end {
				o := max(got[p], 0)
				behind += last - o
				consumed += o
			}
			if behind == 0 && consumed > 0 {
				return nil
			}
		}
		if progress != nil && time.Since(lastPrint) >= time.Second {
			m := w.Metrics
			fmt.Fprintf(progress, "  consumed %d/%d  applied %d  duplicates %d  rejected %d  dead-lettered %d\n",
				consumed, total, m.Applied.Load(), m.Duplicates.Load(), m.Rejected.Load(), m.DeadLettered.Load())
			lastPrint = time.Now()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ledger: group %s still %d behind after 10 minutes", group, behind)
		}
	}
}

// endOffsets returns the log-end offset of partitions 0..n-1 of topic,
// asking again for up to 30 s while a leader is moving or loading.
func endOffsets(ctx context.Context, c *kafka.Client, topic string, n int) (map[int]int64, error) {
	reqs := make([]kafka.OffsetRequest, n)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		end, err := listEnd(ctx, c, topic, reqs)
		var kerr kafka.Error
		if err == nil || !errors.As(err, &kerr) || !kerr.Temporary() || time.Now().After(deadline) {
			return end, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func listEnd(ctx context.Context, c *kafka.Client, topic string, reqs []kafka.OffsetRequest) (map[int]int64, error) {
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("ledger: end offsets of %s: %w", topic, err)
	}
	end := make(map[int]int64, len(reqs))
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("ledger: end offset of %s/%d: %w", topic, p.Partition, p.Error)
		}
		end[p.Partition] = p.LastOffset
	}
	if len(end) != len(reqs) {
		return nil, fmt.Errorf("ledger: end offsets of %s: %d of %d partitions answered", topic, len(end), len(reqs))
	}
	return end, nil
}

// committed returns group's committed offsets on partitions 0..n-1 of
// topic, -1 where it has committed none (a group unknown to the broker has
// committed none).
func committed(ctx context.Context, c *kafka.Client, group, topic string, n int) (map[int]int64, error) {
	got := make(map[int]int64, n)
	ps := make([]int, n)
	for p := range ps {
		ps[p], got[p] = p, -1
	}
	res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	if err == nil && !errors.Is(res.Error, kafka.GroupIdNotFound) {
		err = res.Error
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: committed offsets of %s: %w", group, err)
	}
	for _, p := range res.Topics[topic] {
		switch {
		case errors.Is(p.Error, kafka.GroupIdNotFound):
		case p.Error != nil:
			return nil, fmt.Errorf("ledger: committed offset of %s on %s/%d: %w", group, topic, p.Partition, p.Error)
		default:
			got[p.Partition] = p.CommittedOffset
		}
	}
	return got, nil
}
