package kafkapubsub

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/delivery"
)

// StartOffset says where a consumer group with no committed offset starts.
type StartOffset int64

const (
	// StartFirst starts at the oldest record still in the log.
	StartFirst StartOffset = StartOffset(kafka.FirstOffset)
	// StartLast starts after the newest record: only new records.
	StartLast StartOffset = StartOffset(kafka.LastOffset)
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Brokers to bootstrap from. Required.
	Brokers []string
	// ConsumerGroup is the Kafka consumer group. With a group, partitions
	// are shared among the group's members and acked offsets are committed.
	// Without one, each Subscribe reads every partition from StartOffset and
	// commits nothing. Defaults to no group.
	ConsumerGroup string
	// StartOffset is where a group with no committed offset (or a
	// subscription without a group) starts. Defaults to StartFirst.
	StartOffset StartOffset
	// NackBackoff is the first pause before a nacked message is delivered
	// again; it doubles on each nack of the same message up to
	// MaxNackBackoff. Defaults to 100ms and 5s.
	NackBackoff, MaxNackBackoff time.Duration
	// CommitInterval is how often acked offsets are committed; a negative
	// value commits after every ack. Offsets are also committed when a
	// partition is revoked and on Close. Defaults to 200ms.
	CommitInterval time.Duration
	// MaxInFlight is how many messages of one partition may be delivered
	// and not yet acked at once. Messages go out on the channel in offset
	// order; acks may come in any order, and the committed offset is the
	// contiguous acked watermark: the lowest offset not acked yet. A nacked
	// message keeps its place in the window and is delivered again (same
	// offset, after NackBackoff). Without KeyOrdered a nack rewinds the
	// partition as a seek would: nothing new is delivered while nacked
	// messages wait, and they go out again lowest offset first (messages
	// already delivered behind a nacked one are the consumer's to nack, as
	// consumer.BatchConsumer does); with KeyOrdered the other keys go on. A partition's
	// window holds at most 4 × MaxInFlight records from the watermark on,
	// acked ones included: a message that stays unacked at the bottom
	// stops new deliveries of its partition once the window is full. A
	// crash or a rebalance that gives up unacked messages redelivers
	// everything from the watermark, messages acked above it included; the
	// dedupe middleware absorbs them as duplicates. 1 delivers one message
	// per partition at a time, each only after the previous one's ack.
	// Defaults to 1.
	MaxInFlight int
	// KeyOrdered, with MaxInFlight above 1, lets at most one message per
	// Kafka record key of a partition be in flight: the messages of one key
	// are handled in offset order, one after the other, while other keys
	// run concurrently. A message whose key is busy waits in the window and
	// messages of other keys behind it are delivered past it (up to
	// MaxInFlight in flight and the window's 4 × MaxInFlight records).
	// Records with a null key all count as one key; the empty key is
	// another. Without KeyOrdered the window is in plain offset order, which
	// is what a consumer that reads the channel in one goroutine (a batch)
	// wants. Defaults to false.
	KeyOrdered bool
	// DrainTimeout bounds how long a revoked partition (rebalance or Close)
	// waits for its in-flight messages to be acked before giving them up; a
	// message given up is delivered again to the partition's next owner.
	// Heartbeats go on while partitions drain, so a drain longer than
	// SessionTimeout keeps the membership; the group waits for a draining
	// member only up to RebalanceTimeout, so DrainTimeout must be below it.
	// Defaults to 10s, or half of RebalanceTimeout when that is shorter.
	DrainTimeout time.Duration
	// SessionTimeout, RebalanceTimeout and HeartbeatInterval tune group
	// membership; HeartbeatInterval must be below SessionTimeout. Default to
	// 10s, 30s and 1s.
	SessionTimeout, RebalanceTimeout, HeartbeatInterval time.Duration
	// Isolation says which records of transactional producers are
	// delivered. ReadCommitted delivers only committed data, up to the last
	// stable offset: records of aborted transactions never reach a handler,
	// and a partition waits behind an open transaction until it ends.
	// ReadUncommitted delivers records as they are written, including those
	// of transactions that are later aborted. Control records (transaction
	// markers) are never delivered. Defaults to ReadCommitted.
	Isolation Isolation
	// MaxWait bounds a fetch's wait for new records. Defaults to 250ms.
	MaxWait time.Duration
	// MaxBytes bounds one fetch response per partition. Defaults to 10 MiB.
	MaxBytes int
	// Security holds TLS and SASL settings. Defaults to plain TCP.
	Security Security
	// Positions, when set, keeps the group's committed offsets in the
	// database that holds the consumer's effects too (pgstore.Positions),
	// so that a database that loses its last commits (an asynchronous
	// standby promoted, a restore, a point-in-time recovery) gets the
	// messages it lost delivered again: on assignment a partition starts at
	// the earlier of Kafka's committed offset and the database's position.
	// Each commit saves the positions first, then commits to Kafka; a failed
	// save commits nothing. It needs ConsumerGroup. Defaults to nil: offsets
	// are kept in Kafka alone, and commits a database loses after Kafka's
	// offset passed them are never delivered again.
	Positions Positions
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *SubscriberConfig) withDefaults() (SubscriberConfig, error) {
	var o SubscriberConfig
	if c != nil {
		o = *c
	}
	if len(o.Brokers) == 0 {
		return o, errors.New("kafkapubsub: SubscriberConfig.Brokers is empty: set the Kafka bootstrap addresses")
	}
	if o.Positions != nil && o.ConsumerGroup == "" {
		return o, errors.New("kafkapubsub: SubscriberConfig.Positions is set without ConsumerGroup: positions are kept per group; set ConsumerGroup or leave Positions nil")
	}
	if o.StartOffset == 0 {
		o.StartOffset = StartFirst
	}
	if o.StartOffset != StartFirst && o.StartOffset != StartLast {
		return o, fmt.Errorf("kafkapubsub: SubscriberConfig.StartOffset is %d: use StartFirst or StartLast", o.StartOffset)
	}
	if err := (delivery.Settings{NackBackoff: &o.NackBackoff, MaxNackBackoff: &o.MaxNackBackoff, SessionTimeout: &o.SessionTimeout,
		RebalanceTimeout: &o.RebalanceTimeout, DrainTimeout: &o.DrainTimeout, HeartbeatInterval: &o.HeartbeatInterval, MaxWait: &o.MaxWait,
		CommitInterval: &o.CommitInterval, MaxInFlight: &o.MaxInFlight, MaxBytes: &o.MaxBytes, Logger: &o.Logger}).Default("kafkapubsub"); err != nil {
		return o, err
	}
	switch o.Isolation {
	case 0:
		o.Isolation = ReadCommitted
	case ReadCommitted, ReadUncommitted:
	default:
		return o, fmt.Errorf("kafkapubsub: SubscriberConfig.Isolation is %d: use ReadCommitted or ReadUncommitted", o.Isolation)
	}
	return o, nil
}
