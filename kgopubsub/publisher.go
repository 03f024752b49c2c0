package kgopubsub

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/delivery"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// PublisherConfig configures a Publisher. The embedded
// kafkapubsub.PublisherConfig has the same fields with the same meaning as
// for kafkapubsub's Publisher (Brokers, PartitionKeyFunc,
// AllowAutoTopicCreation, BatchTimeout as the linger, PublishTimeout,
// MaxRecordBytes, Partitioner, Compression, Acks, Security, Logger);
// BatchSize does not apply: franz-go batches by bytes, up to its default
// batch size (about 1 MB, the broker's default max.message.bytes), which
// also bounds one record: a larger one fails with
// kafkapubsub.ErrRecordTooLarge (kafkapubsub's Publisher sends it in a
// batch of its own).
type PublisherConfig struct {
	kafkapubsub.PublisherConfig
	// Options are further franz-go options, applied after the Publisher's
	// own. Defaults to none.
	Options []kgo.Opt
}

func (c *PublisherConfig) withDefaults() (PublisherConfig, error) {
	var o PublisherConfig
	if c != nil {
		o = *c
	}
	if len(o.Brokers) == 0 {
		return o, errors.New("kgopubsub: PublisherConfig.Brokers is empty: set the Kafka bootstrap addresses")
	}
	if o.BatchTimeout == 0 {
		o.BatchTimeout = 5 * time.Millisecond
	}
	if o.PublishTimeout == 0 {
		o.PublishTimeout = 30 * time.Second
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = 100 << 20
	}
	if o.BatchTimeout < 0 || o.PublishTimeout < 0 || o.MaxRecordBytes < 0 {
		return o, errors.New("kgopubsub: PublisherConfig.BatchTimeout, PublishTimeout and MaxRecordBytes must not be negative")
	}
	p, err := kafkapubsub.ParsePartitioner(string(o.Partitioner))
	if err != nil {
		return o, fmt.Errorf("kgopubsub: PublisherConfig.Partitioner: %w", err)
	}
	o.Partitioner = p
	if _, err := codec(o.Compression); err != nil {
		return o, err
	}
	switch o.Acks {
	case "", kafkapubsub.AcksAll, kafkapubsub.AcksLeader:
	default:
		return o, fmt.Errorf("kgopubsub: PublisherConfig.Acks %q: use all or leader", string(o.Acks))
	}
	return o, nil
}

func codec(c kafkapubsub.Compression) (kgo.CompressionCodec, error) {
	switch c {
	case "", kafkapubsub.CompressionNone:
		return kgo.NoCompression(), nil
	case kafkapubsub.CompressionGzip:
		return kgo.GzipCompression(), nil
	case kafkapubsub.CompressionSnappy:
		return kgo.SnappyCompression(), nil
	case kafkapubsub.CompressionLz4:
		return kgo.Lz4Compression(), nil
	case kafkapubsub.CompressionZstd:
		return kgo.ZstdCompression(), nil
	}
	return kgo.NoCompression(), fmt.Errorf("kgopubsub: PublisherConfig.Compression %q: use none, gzip, snappy, lz4 or zstd", string(c))
}

// Publisher is a Watermill publisher on franz-go's idempotent producer:
// every record carries the producer's ID and sequence, so a produce that is
// retried after a lost response is not appended twice, and with Acks all
// (the default) Publish returns once every in-sync replica has the
// records. Records, headers, keys and partitions are as kafkapubsub's
// Publisher makes them (the same Partitioner places a key on the same
// partition), and so is a message the Subscriber delivered published again
// under the ID it arrived with (a dead letter). Safe for concurrent use.
type Publisher struct {
	cfg    PublisherConfig
	cl     *kgo.Client
	mu     sync.RWMutex
	closed bool
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher. cfg is required for its Brokers.
func NewPublisher(cfg *PublisherConfig) (*Publisher, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cc, _ := codec(c.Compression)
	acks := kgo.AllISRAcks()
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.RecordPartitioner(partitioner(c.Partitioner)),
		kgo.ProducerLinger(c.BatchTimeout),
		kgo.ProducerBatchCompression(cc),
		kgo.MaxBufferedRecords(1 << 16),
	}
	if c.Acks == kafkapubsub.AcksLeader {
		// franz-go's idempotence needs acks=all.
		acks = kgo.LeaderAck()
		opts = append(opts, kgo.DisableIdempotentWrite())
	}
	opts = append(opts, kgo.RequiredAcks(acks))
	if c.AllowAutoTopicCreation {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	if c.Logger != nil {
		opts = append(opts, kgo.WithLogger(kgoLogger{c.Logger}))
	}
	opts = append(opts, SecurityOptions(c.Security)...)
	cl, err := kgo.NewClient(append(opts, c.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("kgopubsub: new publisher: %w", err)
	}
	return &Publisher{cfg: c, cl: cl}, nil
}

// ErrPublisherClosed is returned by Publish after Close.
var ErrPublisherClosed = errors.New("kgopubsub: publisher closed")

// Publish writes msgs to topic in order and waits until all are
// acknowledged. A message with no UUID gets a UUIDv7, written into it.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrPublisherClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	records := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		var err error
		if records[i], err = delivery.Outgoing("kgopubsub", topic, m, arrived, p.key, toRecordAsArrived, toRecord); err != nil {
			return err
		}
		if n := recordSize(records[i]); n > p.cfg.MaxRecordBytes {
			return fmt.Errorf("%w: publish %s to %s: the record is %d bytes, PublisherConfig.MaxRecordBytes is %d: raise it (and the topic's max.message.bytes)",
				kafkapubsub.ErrRecordTooLarge, m.UUID, topic, n, p.cfg.MaxRecordBytes)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.PublishTimeout)
	defer cancel()
	if err := p.cl.ProduceSync(ctx, records...).FirstErr(); err != nil {
		if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
			return fmt.Errorf("%w: publish %d message(s) to %s: the broker refused the batch: raise the topic's max.message.bytes: %v",
				kafkapubsub.ErrRecordTooLarge, len(msgs), topic, err)
		}
		return fmt.Errorf("kgopubsub: publish %d message(s) to %s: %w", len(msgs), topic, err)
	}
	return nil
}

func recordSize(r *kgo.Record) int {
	n := 4 + 1 + 1 + 8 + 4 + len(r.Key) + 4 + len(r.Value) + 5
	for _, h := range r.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

func (p *Publisher) key(topic string, m *message.Message) ([]byte, error) {
	if p.cfg.PartitionKeyFunc != nil {
		k, err := p.cfg.PartitionKeyFunc(topic, m)
		if err != nil || k == "" {
			return nil, err
		}
		return []byte(k), nil
	}
	if k := m.Metadata.Get(kafkapubsub.MetadataKafkaKey); k != "" {
		return []byte(k), nil
	}
	return nil, nil
}

// Close flushes pending writes and closes the client. It is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.PublishTimeout)
	defer cancel()
	err := p.cl.Flush(ctx)
	p.cl.Close()
	return err
}

// partitioner places a keyed record where kafkapubsub's Publisher does with
// the same Partitioner: it asks kafka-go's balancer of that name, so the
// two cannot drift apart. A record without a key goes to a random
// partition, as with kafkapubsub.
func partitioner(p kafkapubsub.Partitioner) kgo.Partitioner {
	return keyPartitioner{name: p}
}

type keyPartitioner struct{ name kafkapubsub.Partitioner }

func (k keyPartitioner) ForTopic(string) kgo.TopicPartitioner {
	var b kafka.Balancer
	switch k.name {
	case kafkapubsub.PartitionerFNV1a:
		b = &kafka.Hash{}
	case kafkapubsub.PartitionerCRC32:
		b = &kafka.CRC32Balancer{}
	default:
		b = &kafka.Murmur2Balancer{}
	}
	return &topicPartitioner{b: b}
}

type topicPartitioner struct {
	b kafka.Balancer
	// ids is 0..n-1 for the last partition count seen; a topic partitioner
	// is used by one goroutine at a time.
	ids []int
}

func (t *topicPartitioner) RequiresConsistency(r *kgo.Record) bool { return r.Key != nil }

func (t *topicPartitioner) Partition(r *kgo.Record, n int) int {
	if r.Key == nil {
		return rand.IntN(n)
	}
	if len(t.ids) != n {
		t.ids = make([]int, n)
		for i := range t.ids {
			t.ids[i] = i
		}
	}
	return t.b.Balance(kafka.Message{Key: r.Key}, t.ids...)
}
