package kafkapubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/delivery"
)

// PartitionKeyFunc returns the record key (which picks the partition) of msg
// published to topic.
type PartitionKeyFunc func(topic string, msg *message.Message) (string, error)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Brokers to bootstrap from. Required.
	Brokers []string
	// PartitionKeyFunc returns each record's key. Defaults to the message's
	// MetadataKafkaKey metadata (so a consumed message re-published keeps its
	// key), and no key when that is empty.
	PartitionKeyFunc PartitionKeyFunc
	// AllowAutoTopicCreation lets the broker create unknown topics on
	// publish (if the broker allows it). Defaults to false.
	AllowAutoTopicCreation bool
	// BatchTimeout is how long the writer waits to fill a batch. Defaults to 5ms.
	BatchTimeout time.Duration
	// BatchSize is the most records in one produce request. Defaults to 100.
	BatchSize int
	// PublishTimeout bounds one Publish call. Defaults to 30s.
	PublishTimeout time.Duration
	// MaxRecordBytes is the largest record (key, value and headers) the
	// Publisher sends. Records up to 1 MiB are batched together; a larger
	// one is sent in a batch of its own, so that it is bounded by the
	// topic's max.message.bytes alone (a dead-letter topic for large
	// records needs it raised, as does the source topic). A record over
	// MaxRecordBytes fails with ErrRecordTooLarge, naming this field.
	// Defaults to 100 MiB (the broker's default socket.request.max.bytes).
	MaxRecordBytes int
	// Partitioner picks a keyed record's partition; pick the one the
	// topic's other producers use (see Partitioner). Defaults to
	// PartitionerMurmur2, the Java producer's.
	Partitioner Partitioner
	// Compression is the batches' codec. Defaults to CompressionNone.
	Compression Compression
	// Acks is how many replicas must have a record before Publish
	// returns. Defaults to AcksAll.
	Acks Acks
	// Security holds TLS and SASL settings. Defaults to plain TCP.
	Security Security
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *PublisherConfig) withDefaults() (PublisherConfig, error) {
	var o PublisherConfig
	if c != nil {
		o = *c
	}
	if len(o.Brokers) == 0 {
		return o, errors.New("kafkapubsub: PublisherConfig.Brokers is empty: set the Kafka bootstrap addresses")
	}
	if o.BatchTimeout == 0 {
		o.BatchTimeout = 5 * time.Millisecond
	}
	if o.BatchSize == 0 {
		o.BatchSize = 100
	}
	if o.PublishTimeout == 0 {
		o.PublishTimeout = 30 * time.Second
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = 100 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.BatchTimeout < 0 || o.BatchSize < 0 || o.PublishTimeout < 0 || o.MaxRecordBytes < 0 {
		return o, errors.New("kafkapubsub: PublisherConfig.BatchTimeout, BatchSize, PublishTimeout and MaxRecordBytes must not be negative")
	}
	p, err := ParsePartitioner(string(o.Partitioner))
	if err != nil {
		return o, fmt.Errorf("kafkapubsub: PublisherConfig.Partitioner: %w", err)
	}
	o.Partitioner = p
	if _, err := o.Compression.codec(); err != nil {
		return o, err
	}
	if _, err := o.Acks.required(); err != nil {
		return o, err
	}
	return o, nil
}

// Publisher is a Watermill publisher on a kafka-go Writer. Every record is
// acknowledged by all in-sync replicas before Publish returns (unless
// PublisherConfig.Acks says otherwise); the message UUID travels in header
// UUIDHeader and metadata in headers. A message with no UUID gets a UUIDv7,
// written into the message, so publishing it again sends the same ID.
//
// A message that a Subscriber delivered, published again with the UUID it
// arrived with (a dead letter from a PoisonQueue, a message forwarded as it
// is), goes out as the record that arrived: its key (unless
// PartitionKeyFunc or MetadataKafkaKey says otherwise), its value and its
// headers in their order, a repeated name included, with no UUID header if
// it arrived with none; metadata added since (a dead letter's reasons)
// follows as headers, and headers whose metadata was changed or deleted
// are left out (a changed one is added again with its new value). Records with the same key go to the
// same partition (murmur2, as Kafka's Java producer, unless
// PublisherConfig.Partitioner says otherwise). Safe for concurrent use.
//
// Records larger than 1 MiB (kafka-go's batch limit, and the broker's
// default message.max.bytes) are sent one per batch, up to MaxRecordBytes;
// the topic's max.message.bytes decides whether the broker takes them.
type Publisher struct {
	cfg PublisherConfig
	w   *kafka.Writer
	// large sends records over batchBytes, one per batch; its limit has
	// room over MaxRecordBytes, which Publish checks itself.
	large  *kafka.Writer
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
	transport := c.Security.transport()
	codec, _ := c.Compression.codec()
	acks, _ := c.Acks.required()
	writer := func(batchSize, batchBytes int) *kafka.Writer {
		return &kafka.Writer{
			Addr:                   kafka.TCP(c.Brokers...),
			Balancer:               c.Partitioner.balancer(),
			RequiredAcks:           acks,
			Compression:            codec,
			BatchTimeout:           c.BatchTimeout,
			BatchSize:              batchSize,
			BatchBytes:             int64(batchBytes),
			AllowAutoTopicCreation: c.AllowAutoTopicCreation,
			Transport:              transport,
			ErrorLogger:            kafkaLogger(c.Logger, slog.LevelWarn),
		}
	}
	return &Publisher{cfg: c, w: writer(c.BatchSize, batchBytes), large: writer(1, max(c.MaxRecordBytes, batchBytes)+64<<10)}, nil
}

// batchBytes bounds a batch of several records: kafka-go's default, and
// about the broker's default message.max.bytes.
const batchBytes = 1 << 20

// ErrRecordTooLarge is wrapped by Publish's error when a record is larger
// than PublisherConfig.MaxRecordBytes or than the topic accepts; the error
// says which limit it hit.
var ErrRecordTooLarge = errors.New("kafkapubsub: record too large")

// recordSize is a record's size as kafka-go counts it against a batch limit.
func recordSize(m *kafka.Message) int {
	n := 4 + 1 + 1 + 8 + 4 + len(m.Key) + 4 + len(m.Value) + varintLen(len(m.Headers))
	for _, h := range m.Headers {
		n += varintLen(len(h.Key)) + len(h.Key) + varintLen(len(h.Value)) + len(h.Value)
	}
	return n
}

func varintLen(n int) int {
	l := 1
	for u := uint64(n) << 1; u >= 0x80; u >>= 7 { // zig-zag, as Kafka's varints
		l++
	}
	return l
}

// ErrPublisherClosed is returned by Publish after Close.
var ErrPublisherClosed = errors.New("kafkapubsub: publisher closed")

// Publish writes msgs to topic in order and waits until all are acknowledged.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrPublisherClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	records := make([]kafka.Message, len(msgs))
	sizes := make([]int, len(msgs))
	for i, m := range msgs {
		// A message delivered by a Subscriber and published again under
		// the ID it arrived with (a dead letter) goes out as the record
		// it was: with no ID when it arrived with none.
		var err error
		if records[i], err = delivery.Outgoing("kafkapubsub", topic, m, arrived, p.key, toKafkaAsArrived, toKafka); err != nil {
			return err
		}
		sizes[i] = recordSize(&records[i])
		if sizes[i] > p.cfg.MaxRecordBytes {
			return fmt.Errorf("%w: publish %s to %s: the record is %d bytes, PublisherConfig.MaxRecordBytes is %d: raise it (and the topic's max.message.bytes)",
				ErrRecordTooLarge, m.UUID, topic, sizes[i], p.cfg.MaxRecordBytes)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.PublishTimeout)
	defer cancel()
	// In order: runs of small records go in batches, large ones alone.
	for start := 0; start < len(records); {
		large := sizes[start] > batchBytes-1024
		end := start + 1
		for end < len(records) && (sizes[end] > batchBytes-1024) == large {
			end++
		}
		w := p.w
		if large {
			w = p.large
		}
		if err := w.WriteMessages(ctx, records[start:end]...); err != nil {
			if tooLarge(err) {
				return p.tooLarge(topic, msgs[start:end], sizes[start:end], err)
			}
			return fmt.Errorf("kafkapubsub: publish %d message(s) to %s: %w", end-start, topic, err)
		}
		start = end
	}
	return nil
}

// tooLarge reports whether the broker (or kafka-go) refused a record for
// its size.
func tooLarge(err error) bool {
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil && errors.Is(e, kafka.MessageSizeTooLarge) {
				return true
			}
		}
	}
	return errors.Is(err, kafka.MessageSizeTooLarge)
}

// tooLarge says which limit a refused record hit: the topic's
// max.message.bytes, looked up for the message.
func (p *Publisher) tooLarge(topic string, msgs []*message.Message, sizes []int, err error) error {
	biggest := 0
	for i := range sizes {
		if sizes[i] > sizes[biggest] {
			biggest = i
		}
	}
	limit := "its max.message.bytes"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, lerr := topicConfig(ctx, p.cfg.Brokers, p.cfg.Security, topic, "max.message.bytes"); lerr == nil {
		limit = "max.message.bytes=" + v
	}
	return fmt.Errorf("%w: publish %d message(s) to %s: the broker refused the batch (largest record %s, %d bytes): topic %s accepts batches up to %s: raise the topic's max.message.bytes: %v",
		ErrRecordTooLarge, len(msgs), topic, msgs[biggest].UUID, sizes[biggest], topic, limit, err)
}

func (p *Publisher) key(topic string, m *message.Message) ([]byte, error) {
	if p.cfg.PartitionKeyFunc != nil {
		k, err := p.cfg.PartitionKeyFunc(topic, m)
		if err != nil || k == "" {
			return nil, err
		}
		return []byte(k), nil
	}
	if k := m.Metadata.Get(MetadataKafkaKey); k != "" {
		return []byte(k), nil
	}
	return nil, nil
}

// Close flushes pending writes and closes the writer. It is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return errors.Join(p.w.Close(), p.large.Close())
}

// kafkaLogger bridges kafka-go's Printf loggers into slog.
func kafkaLogger(l *slog.Logger, level slog.Level) kafka.LoggerFunc {
	return func(format string, args ...any) {
		l.Log(context.Background(), level, "kafka-go: "+fmt.Sprintf(format, args...))
	}
}
