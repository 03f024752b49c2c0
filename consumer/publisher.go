package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"
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
		return o, errors.New("consumer: PublisherConfig.Brokers is empty: set the Kafka bootstrap addresses")
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
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.BatchTimeout < 0 || o.BatchSize < 0 || o.PublishTimeout < 0 {
		return o, errors.New("consumer: PublisherConfig.BatchTimeout, BatchSize and PublishTimeout must not be negative")
	}
	return o, nil
}

// Publisher is a Watermill publisher on a kafka-go Writer. Every record is
// acknowledged by all in-sync replicas (RequireAll) before Publish returns;
// the message UUID travels in header UUIDHeader and metadata in headers.
// Records with the same key go to the same partition (murmur2, as Kafka's
// Java producer). Safe for concurrent use.
type Publisher struct {
	cfg    PublisherConfig
	w      *kafka.Writer
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
	w := &kafka.Writer{
		Addr:                   kafka.TCP(c.Brokers...),
		Balancer:               &kafka.Murmur2Balancer{},
		RequiredAcks:           kafka.RequireAll,
		BatchTimeout:           c.BatchTimeout,
		BatchSize:              c.BatchSize,
		AllowAutoTopicCreation: c.AllowAutoTopicCreation,
		Transport:              c.Security.transport(),
		ErrorLogger:            kafkaLogger(c.Logger, slog.LevelWarn),
	}
	return &Publisher{cfg: c, w: w}, nil
}

// ErrPublisherClosed is returned by Publish after Close.
var ErrPublisherClosed = errors.New("consumer: publisher closed")

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
	for i, m := range msgs {
		key, err := p.key(topic, m)
		if err != nil {
			return fmt.Errorf("consumer: publish %s to %s: partition key: %w", m.UUID, topic, err)
		}
		records[i] = toKafka(topic, m, key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.PublishTimeout)
	defer cancel()
	if err := p.w.WriteMessages(ctx, records...); err != nil {
		return fmt.Errorf("consumer: publish %d message(s) to %s: %w", len(msgs), topic, err)
	}
	return nil
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
	return p.w.Close()
}

// kafkaLogger bridges kafka-go's Printf loggers into slog.
func kafkaLogger(l *slog.Logger, level slog.Level) kafka.LoggerFunc {
	return func(format string, args ...any) {
		l.Log(context.Background(), level, "kafka-go: "+fmt.Sprintf(format, args...))
	}
}
