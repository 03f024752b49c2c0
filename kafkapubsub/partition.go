package kafkapubsub

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/delivery"
)

// consumePartition reads one partition in order and delivers it through a
// window of up to MaxInFlight messages (delivery.Partition). subCtx carries the
// subscription's values into message contexts; stopCtx ends the reading,
// after which the in-flight messages drain. acked is called with the next
// offset to commit each time the watermark moves: after acks, and after a
// run of hidden records (transaction markers, aborted records).
func (s *Subscriber) consumePartition(subCtx, stopCtx context.Context, topic string, partition int, start int64, out chan<- *message.Message, acked func(next int64)) {
	f := &fetcher{
		transport: s.transport(topic), addr: kafka.TCP(s.cfg.Brokers...), topic: topic, partition: partition,
		committed: s.cfg.Isolation == ReadCommitted, maxBytes: s.cfg.MaxBytes, maxWait: s.cfg.MaxWait,
	}
	pos, ok := s.resolveOffset(stopCtx, topic, partition, start)
	if !ok {
		return
	}
	// The next response is fetched while this one is delivered.
	ctx, cancel := context.WithCancel(stopCtx)
	responses := make(chan delivery.Batch[kafka.Message], 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.fetchLoop(ctx, f, pos, responses)
	}()
	defer func() { cancel(); <-done }()

	d := &delivery.Partition[kafka.Message]{
		Config: s.delivery(), Topic: topic, Partition: int32(partition), Start: pos,
		Meta:    func(km *kafka.Message) (int64, []byte) { return km.Offset, km.Key },
		Prepare: (&preparer{partition: strconv.Itoa(partition)}).prepare,
		Batches: responses,
	}
	d.Run(subCtx, stopCtx, out, acked)
}

// preparer makes the messages of one partition's records.
type preparer struct {
	partition string
	stamps    delivery.Stamps
}

// prepare makes the message of a delivery of *km (delivery.Partition
// gives it its context).
func (pr *preparer) prepare(km *kafka.Message) *message.Message {
	return toWatermill(km, pr.partition, &pr.stamps)
}

// delivery is what each partition's delivery takes of the configuration.
func (s *Subscriber) delivery() delivery.Config {
	c := s.cfg
	return delivery.Config{MaxInFlight: c.MaxInFlight, KeyOrdered: c.KeyOrdered, NackBackoff: c.NackBackoff, MaxNackBackoff: c.MaxNackBackoff,
		DrainTimeout: c.DrainTimeout, Logger: c.Logger, Name: "kafkapubsub"}
}

// fetchLoop fetches f's partition from pos and sends every response that
// moves the position on, until ctx ends.
func (s *Subscriber) fetchLoop(ctx context.Context, f *fetcher, pos int64, responses chan<- delivery.Batch[kafka.Message]) {
	bo := retryBackoff()
	for {
		res, err := f.fetch(ctx, pos)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, kafka.OffsetOutOfRange) {
			// Retention removed the records at pos (or the topic was
			// recreated): start again where a new group would.
			next, ok := s.resolveOffset(ctx, f.topic, f.partition, int64(s.cfg.StartOffset))
			if !ok {
				return
			}
			s.log().Warn("kafkapubsub: offset out of range; starting again at StartOffset", "topic", f.topic, "partition", f.partition, "offset", pos, "restart", next)
			pos = next
			continue
		}
		if err != nil {
			s.log().Warn("kafkapubsub: fetch failed; retrying", "topic", f.topic, "partition", f.partition, "offset", pos, "err", err)
			if bo.Sleep(ctx) != nil {
				return
			}
			continue
		}
		bo.Reset()
		if res.next == pos && res.n == 0 {
			continue
		}
		// The position after the response goes with its last chunk.
		for i := 0; i == 0 || i < len(res.chunks); i++ {
			b := delivery.Batch[kafka.Message]{Next: res.next}
			if len(res.chunks) > 0 {
				b.Records = res.chunks[i]
			}
			if i < len(res.chunks)-1 {
				b.Next = 0
			}
			select {
			case responses <- b:
			case <-ctx.Done():
				return
			}
		}
		pos = res.next
	}
}

// resolveOffset turns StartFirst and StartLast into an offset of partition,
// retrying until it succeeds or ctx ends (ok false).
func (s *Subscriber) resolveOffset(ctx context.Context, topic string, partition int, start int64) (int64, bool) {
	if start >= 0 {
		return start, true
	}
	c := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Timeout: 10 * time.Second, Transport: s.transport(topic)}
	isolation := kafka.ReadUncommitted
	if s.cfg.Isolation == ReadCommitted {
		isolation = kafka.ReadCommitted
	}
	for bo := retryBackoff(); ; {
		req := kafka.FirstOffsetOf(partition)
		if start == kafka.LastOffset {
			req = kafka.LastOffsetOf(partition)
		}
		res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {req}}, IsolationLevel: isolation})
		if err == nil {
			for _, p := range res.Topics[topic] {
				switch {
				case p.Partition != partition:
				case p.Error != nil:
					err = p.Error
				case start == kafka.LastOffset:
					return p.LastOffset, true
				default:
					return p.FirstOffset, true
				}
			}
			if err == nil {
				err = fmt.Errorf("no offsets for partition %d", partition)
			}
		}
		s.log().Warn("kafkapubsub: list offsets failed; retrying", "topic", topic, "partition", partition, "err", err)
		if bo.Sleep(ctx) != nil {
			return 0, false
		}
	}
}
