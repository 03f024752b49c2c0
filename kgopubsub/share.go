package kgopubsub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/subscriptions"
)

// ShareSubscriber is a Watermill subscriber on a share group (KIP-932).
// The share group is ConsumerGroup; the broker, not the members, decides
// who gets which record, so any member may get any record of any
// partition, and two members may hold copies of one command at once (a
// lock that timed out, a record copied ahead, a producer's retry): the
// dedupe store makes each of them safe.
//
// What a share group does not give, and what the ShareSubscriber does
// about it:
//   - No order: records of one key may be applied in any order, by any
//     member. KeyOrdered is refused; a handler whose commands depend on
//     each other returns a retryable error for a command that comes too
//     early, and it is delivered again.
//   - No positions: the broker keeps each record's state, not a committed
//     offset, so Positions is refused (a database restored to an earlier
//     point gets no records again; reset the share group's start offset to
//     before that point, and the dedupe store skips what survived).
//   - A limit on deliveries (the group's share.delivery.count.limit, 5 by
//     default): the broker archives a record delivered that many times
//     without success. The ShareSubscriber keeps that from losing a
//     command: a record handed out for one of its last two times (the
//     last one only, with a limit of 2; never the first time) is first
//     copied to the end of its partition, unchanged but for two headers
//     that carry the count of its deliveries on
//     (exactly_share_deliveries) and the topic, partition and offset of
//     the record first produced (exactly_share_origin); the copy is one more delivery of
//     the same message ID, which the dedupe store skips once the command
//     is applied. A copy's context carries its original's coordinates
//     (dedupe.SourceFromContext), so that keys made of them
//     (consumer.KeyFromOffset, MissingKey Derive) are the original's
//     too. Once copied, the record is accepted at once, before its
//     handler runs: the copy carries the command on, so a member that dies
//     while it handles the record (a handler that kills its process, an
//     OOM) leaves one copy, not a record released to be copied again. This
//     needs the Write right on the topic (Subscribe loads the copies'
//     producer ID, and fails without it). A command whose handler fails on
//     and on is dead-lettered after MaxAttempts failures in one member, its
//     copies' included; one delivered more than twice MaxAttempts times,
//     by every member and its copies (the count the copies carry), deaths
//     included, is dead-lettered without running its handler (the
//     consumer middleware's). What this does not cover: a record whose members die, on
//     both of its last two deliveries (on the last, with a limit of 2),
//     between the broker handing it out and the copy's acknowledgement (a
//     produce's round trip: 2ms at the median, 11 to 17ms at the 99th
//     percentile in TestShareKilledWorkers, on one broker on loopback); copies the brokers refuse
//     for 30s on both; a copy over the topic's max.message.bytes even
//     compressed (copies are batched up to the topic's max.message.bytes;
//     one larger uncompressed, of a record its producer compressed, is
//     copied compressed with zstd; MESSAGE_TOO_LARGE is logged as an
//     ERROR); records fetched but not yet handed out
//     when the subscription closes; and a limit lowered less than 5s
//     ago: such a record, if that delivery was its last, is archived by
//     the broker. On Kafka 4.4 and later, a dead-letter topic set on the
//     group (errors.deadletterqueue.topic.name, KIP-1191) gets the records
//     the broker archives, rejected ones included, with their key and
//     value and their topic, partition and offset in __dlq.errors.*
//     headers, but not their own headers (the message ID among them):
//     redeliver the original record those headers point at, never the
//     dead-letter record, so that the dedupe store knows the command. Do
//     not add that topic to the group's subscriptions: the broker writes
//     the records it archives there back to it.
//
// A message's Ack accepts its record, and the broker never hands it out
// again. An Ack after the message was dead-lettered (it carries a new
// "reason_poisoned" metadata value, as middleware.PoisonQueue sets) rejects
// it: the broker archives it as rejected. A Nack hands the same record to
// the handler again after NackBackoff while its lock lasts, and releases
// it to the group (delivery count + 1) when it does not. Keep the handler's
// bound (worker.Config.Timeout, 30s by default) below the group's lock
// (share.record.lock.duration.ms, 30s by default): an Ack that comes after
// the lock ran out is refused, and the record is delivered again (a
// duplicate, which the dedupe store skips; a dead letter's Reject is made
// again at once when the record comes back to the member that made it,
// while another member handles it again). The worker's Timeout defaults to
// 20s on a share group for this.
//
// A share group's share.auto.offset.reset and share.isolation.level are
// the group's, for every member: Subscribe sets those the group has not
// set yet from StartOffset (StartFirst is "earliest", so that records
// produced before the group's first member are consumed) and Isolation,
// and refuses, with ErrShareGroupSettings, a member whose StartOffset or
// Isolation differs from what the group has set (a ReadUncommitted member
// would otherwise make the read-committed ones apply aborted
// transactions). A running subscription reads them again every 5s, and
// ends, with an ERROR, when they are no longer its own (a worker then
// stops). The role needs the DescribeConfigs right on the group, and
// AlterConfigs until both are set. Its client keeps
// idle connections 5 minutes (a closed connection ends the member's share
// session, and the broker releases what it holds): Subscribe refuses a
// group whose record lock is not below that (set a kgo.ConnIdleTimeout
// above it in the Options), or a kgo.ConnIdleTimeout in the Options that
// is not above the lock; a lock raised later is logged. Subscribe refuses
// the other franz-go Options that would undo what the member needs of its
// client: kgo.MaxConcurrentFetches (fetching ahead: records acquired wait in
// a buffer while their locks run out), kgo.ShareMaxRecords (use
// MaxInFlight), kgo.ShareGroup, kgo.ConsumeTopics and kgo.ConsumeRegex (use
// ConsumerGroup and Subscribe's topic), and, for the copies,
// kgo.ProducerLinger, kgo.RequiredAcks other than all and
// kgo.DisableIdempotentWrite.
type ShareSubscriber struct {
	cfg  SubscriberConfig
	subs *subscriptions.Set
}

var _ message.Subscriber = (*ShareSubscriber)(nil)

// NewShareSubscriber returns a ShareSubscriber. cfg needs Brokers and
// ConsumerGroup (the share group). MaxInFlight is how many records the
// subscription holds and hands out at once (default 1). KeyOrdered,
// Positions and InstanceID are refused; the group timeouts, CommitInterval
// and MaxBytes do not apply.
func NewShareSubscriber(cfg *SubscriberConfig) (*ShareSubscriber, error) {
	var in SubscriberConfig
	if cfg != nil {
		in = *cfg
	}
	switch {
	case in.GroupProtocol != "" && in.GroupProtocol != ProtocolShare:
		return nil, fmt.Errorf("kgopubsub: NewShareSubscriber with GroupProtocol %q: a share group is ProtocolShare; use NewSubscriber for a consumer group", in.GroupProtocol)
	case in.ConsumerGroup == "":
		return nil, errors.New("kgopubsub: SubscriberConfig.ConsumerGroup is empty: a ShareSubscriber needs the share group's name")
	case in.KeyOrdered:
		return nil, errors.New("kgopubsub: SubscriberConfig.KeyOrdered is set with a share group: the broker hands records out one by one to any member, so there is no per-key order to keep; leave it false")
	case in.Positions != nil:
		return nil, errors.New("kgopubsub: SubscriberConfig.Positions is set with a share group: the broker keeps each record's state, not a committed offset; leave it nil")
	case in.InstanceID != "":
		return nil, errors.New("kgopubsub: SubscriberConfig.InstanceID is set with a share group: share groups have no static members; leave it empty")
	}
	in.GroupProtocol = ""
	c, err := in.withDefaults()
	if err != nil {
		return nil, err
	}
	c.GroupProtocol = ProtocolShare
	return &ShareSubscriber{cfg: c, subs: subscriptions.New()}, nil
}

// Close stops every subscription, waits for in-flight messages to drain (up
// to DrainTimeout), sends the last acknowledgements and leaves the group.
// It is idempotent.
func (s *ShareSubscriber) Close() error {
	s.subs.Close()
	return nil
}

// SharedGroup reports that the ShareSubscriber consumes a share group:
// the worker keeps no positions for it.
func (s *ShareSubscriber) SharedGroup() bool { return true }

// shareSub is one subscription of a ShareSubscriber.
type shareSub struct {
	s     *ShareSubscriber
	cl    *kgo.Client
	topic string
	out   chan *message.Message
	// maxBytes is the topic's max.message.bytes, the size of the copies'
	// batches.
	maxBytes int32
	// ctx ends with the subscription; set by run.
	ctx context.Context
	// limit is the group's delivery limit, read by the records'
	// goroutines and refreshed by the poll loop.
	limit atomic.Int32

	mu sync.Mutex
	// dead holds the commands this subscription dead-lettered (by origin:
	// the record first produced, so that a copy made before the dead
	// letter is known too, and a command published again, a new record,
	// is not; up to maxDead), so that a record whose Reject came too late, or a
	// copy of it, is rejected again at once instead of being handled, and
	// dead-lettered, again.
	dead map[string]struct{}
}

// maxDead bounds the dead-lettered records a subscription remembers.
const maxDead = 10000
