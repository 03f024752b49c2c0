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

	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/clock"
	"github.com/exactly-go/exactly/internal/subscriptions"
)

// Subscriber is a Watermill subscriber on segmentio/kafka-go.
//
// With a consumer group it uses kafka-go's low-level ConsumerGroup and
// Generation API: each assigned partition is read by its own goroutine,
// strictly in order, while partitions run concurrently. By default one
// message of a partition is in flight at a time; MaxInFlight opens a window
// of several, and KeyOrdered keeps one per record key in it. Ack lets the
// partition's offset advance past the message once every message below it
// is acked too (the committed offset is the contiguous acked watermark);
// Nack delivers the same message again after a back-off, never skipping it.
// Offsets are committed with the generation that fetched the messages, so a
// commit never crosses a rebalance: when a generation ends, each partition
// stops fetching, waits (up to DrainTimeout, heartbeating all along) for its
// in-flight messages, commits, and only then does the group rejoin.
//
// Records are read with kafka-go's Transport and filtered here: under
// ReadCommitted (the default) records of aborted transactions and control
// records are never delivered and nothing past the last stable offset is;
// the offsets of hidden records are still committed, so a partition whose
// tail is a transaction marker does not look lagging.
type Subscriber struct {
	cfg SubscriberConfig
	// transports holds one kafka-go Transport per topic, whose metadata
	// covers that topic alone (a cluster's full metadata can be large).
	transports map[string]*kafka.Transport
	mu         sync.Mutex
	subs       *subscriptions.Set
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a Subscriber. cfg is required for its Brokers.
func NewSubscriber(cfg *SubscriberConfig) (*Subscriber, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Subscriber{cfg: c, transports: map[string]*kafka.Transport{}, subs: subscriptions.New()}, nil
}

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("kafkapubsub: subscriber closed")

// Subscribe starts consuming topic. The channel closes when ctx is done or
// the Subscriber is closed, after in-flight messages have drained.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("kafkapubsub: Subscribe: topic is empty")
	}
	out := make(chan *message.Message)
	if !s.subs.Start(ctx, out, func(ctx context.Context) {
		if s.cfg.ConsumerGroup != "" {
			s.runGroup(ctx, topic, out)
		} else {
			s.runWithoutGroup(ctx, topic, out)
		}
	}) {
		return nil, ErrSubscriberClosed
	}
	return out, nil
}

// Close stops every subscription, waits for in-flight messages to drain
// (up to DrainTimeout), commits and leaves the group. It is idempotent.
func (s *Subscriber) Close() error {
	s.subs.Close()
	s.mu.Lock()
	for _, t := range s.transports {
		t.CloseIdleConnections()
	}
	s.mu.Unlock()
	return nil
}

func (s *Subscriber) log() *slog.Logger { return s.cfg.Logger }

// transport returns the Transport for topic's subscriptions.
func (s *Subscriber) transport(topic string) *kafka.Transport {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.transports[topic]
	if !ok {
		t = s.cfg.Security.transport()
		t.MetadataTopics = []string{topic}
		s.transports[topic] = t
	}
	return t
}

// runWithoutGroup reads every partition of topic from StartOffset and
// commits nothing.
func (s *Subscriber) runWithoutGroup(ctx context.Context, topic string, out chan<- *message.Message) {
	parts, ok := s.waitForTopic(ctx, topic)
	if !ok {
		return
	}
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.consumePartition(ctx, ctx, topic, p.ID, int64(s.cfg.StartOffset), out, func(int64) {})
		}()
	}
	wg.Wait()
}

// waitForTopic returns topic's partitions once it exists, saying at WARN
// while it does not; ok is false when ctx ends first.
func (s *Subscriber) waitForTopic(ctx context.Context, topic string) (parts []kafka.Partition, ok bool) {
	for bo, n := retryBackoff(), 0; ; n++ {
		var err error
		parts, err = s.partitions(ctx, topic)
		if err == nil && len(parts) > 0 {
			if n > 0 {
				s.log().Info("kafkapubsub: topic is there; consuming", "topic", topic, "partitions", len(parts))
			}
			return parts, true
		}
		pause := bo.Next()
		s.log().Warn("kafkapubsub: topic does not exist (yet); waiting for it", "topic", topic, "group", s.cfg.ConsumerGroup, "err", err, "retry", pause)
		if clock.Sleep(ctx, pause) != nil {
			return nil, false
		}
	}
}

func (s *Subscriber) partitions(ctx context.Context, topic string) ([]kafka.Partition, error) {
	// A transport of its own: a shared one answers from its metadata cache,
	// which learns of a new topic only when it refreshes.
	t := s.cfg.Security.transport()
	t.MetadataTopics = []string{topic}
	defer t.CloseIdleConnections()
	c := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Timeout: 10 * time.Second, Transport: t}
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, err
	}
	if len(md.Topics) != 1 {
		return nil, fmt.Errorf("no metadata for topic %s", topic)
	}
	if md.Topics[0].Error != nil {
		return nil, md.Topics[0].Error
	}
	return md.Topics[0].Partitions, nil
}

// SubscribeInitialize creates topic if it does not exist (Watermill's
// SubscribeInitializer), with one partition; create topics with more
// partitions ahead of time.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Timeout: 10 * time.Second, Transport: s.cfg.Security.transport()}
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}})
	if err != nil {
		return fmt.Errorf("kafkapubsub: create topic %s: %w", topic, err)
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("kafkapubsub: create topic %s: %w", topic, err)
	}
	return nil
}

// retryBackoff is the pause between attempts to reach the brokers: 100ms,
// doubling up to 5s.
func retryBackoff() *backoff.Backoff { return backoff.New(100*time.Millisecond, 5*time.Second) }
