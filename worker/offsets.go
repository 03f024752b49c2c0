package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/kafkaadmin"
)

// PartitionOffsets is where one partition of the worker's topic stands.
type PartitionOffsets struct {
	Topic     string
	Partition int
	// Committed is the group's committed offset in Kafka; -1 when none.
	Committed int64
	// Position is the group's position kept in the database with the data
	// (the next offset to apply); -1 when none, or with Config.NoPositions.
	// Above Committed, Kafka's commit is behind (it catches up at the next
	// commit); below it, the database lost commits (a restore, a failover)
	// and the Subscriber re-applies from it.
	Position int64
	// End is the partition's log-end offset: End minus the lower of
	// Committed and Position is the group's lag.
	End int64
}

// Offsets reads where each partition of Config.Topic stands: the group's
// committed offset in Kafka, its position in the database, and the
// partition's end. It needs Config.Brokers (a Subscriber of the user's
// has no brokers to ask).
func (w *Worker) Offsets(ctx context.Context) ([]PartitionOffsets, error) {
	if len(w.cfg.Brokers) == 0 {
		return nil, errors.New("worker: Offsets needs Config.Brokers")
	}
	if sharedGroup(&w.cfg) {
		return nil, errors.New("worker: Offsets is for consumer groups: a share group keeps each record's state, not a committed offset (kafka-share-groups.sh --describe shows its start offset and lag)")
	}
	c, done := w.kafkaClient()
	defer done()
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{w.cfg.Topic}})
	if err != nil {
		return nil, fmt.Errorf("worker: offsets of %s: %w", w.cfg.Topic, err)
	}
	n := 0
	for _, t := range md.Topics {
		if t.Name == w.cfg.Topic {
			if t.Error != nil {
				return nil, fmt.Errorf("worker: offsets of %s: %w", w.cfg.Topic, t.Error)
			}
			n = len(t.Partitions)
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("worker: offsets of %s: the topic has no partitions", w.cfg.Topic)
	}
	end, err := kafkaadmin.EndOffsets(ctx, c, w.cfg.Topic, n)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	committed, err := kafkaadmin.Committed(ctx, c, w.cfg.Group, w.cfg.Topic, n)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	partitions := make([]int, n)
	for p := range partitions {
		partitions[p] = p
	}
	var saved map[int]int64
	if !w.cfg.NoPositions {
		if saved, err = w.store.Positions().Load(ctx, w.cfg.Group, w.cfg.Topic, partitions); err != nil {
			return nil, fmt.Errorf("worker: positions of %s: %w", w.cfg.Topic, err)
		}
	}
	out := make([]PartitionOffsets, n)
	for p := range out {
		pos, ok := saved[p]
		if !ok {
			pos = -1
		}
		out[p] = PartitionOffsets{Topic: w.cfg.Topic, Partition: p, Committed: committed[p], Position: pos, End: end[p]}
	}
	return out, nil
}
