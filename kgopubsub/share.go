package kgopubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/mdkeys"
	"github.com/exactly-go/exactly/internal/subscriptions"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// ProtocolShare consumes as a member of a share group (KIP-932, Kafka's
// queues; Kafka 4.2 and later): the broker hands records out one by one to
// the group's members, each locked to one member until it is acknowledged
// or its lock times out. See ShareSubscriber.
const ProtocolShare GroupProtocol = "share"

// MetadataDeliveryCount is the metadata key of the delivery count of a
// message a ShareSubscriber delivers: 1 the first time the share group
// hands the record out, more after its lock timed out or it was released,
// its copies' deliveries included (the message's context carries it too,
// dedupe.DeliveriesFromContext: the consumer then counts the failures of
// a record and its copies together towards MaxAttempts).
const MetadataDeliveryCount = "kafka_delivery_count"

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

// Subscribe checks that the brokers serve share groups, sets the group's
// configuration, loads the producer ID of the copies (the role needs the
// Write right on the topic, or IdempotentWrite on the cluster), and starts consuming topic as a member of the share group
// of its own (one per call). The channel closes when ctx is done or the
// ShareSubscriber is closed, after in-flight messages have drained (up to
// DrainTimeout; those not done by then are released to the group).
func (s *ShareSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("kgopubsub: Subscribe: topic is empty")
	}
	var maxBytes atomic.Int32
	maxBytes.Store(defaultMaxMessageBytes)
	opts := []kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ShareGroup(s.cfg.ConsumerGroup),
		// The broker hands out at most MaxInFlight records at a time: a
		// record acquired is locked to this member, and one waiting in a
		// buffer would see its lock run out.
		kgo.ShareMaxRecords(int32(s.cfg.MaxInFlight)),
		kgo.ShareMaxRecordsStrict(),
		kgo.FetchMaxWait(s.cfg.MaxWait),
		kgo.WithLogger(kgoLogger{s.cfg.Logger}),
		kgo.MetadataMaxAge(partitionWatch),
		// The client produces only the copies of records near their last
		// delivery, at once: a copy that lingers is a longer window in
		// which a kill loses one.
		kgo.ProducerLinger(0),
		// A copy is as large as its record, which the topic took: the
		// copies' batches may be as large as the topic allows
		// (max.message.bytes, read below), not franz-go's default of about
		// 1 MB, checked on the uncompressed records.
		kgo.ProducerBatchMaxBytesFn(func(string) int32 { return maxBytes.Load() }),
		// The broker ends a member's share session with its connection,
		// and releases every record the member holds: a connection must
		// not be closed as idle while handlers run, as franz-go does after
		// 30s by default. A record is held for its lock at most (60s at
		// most, by Kafka's default group.share.max.record.lock.duration.ms).
		kgo.ConnIdleTimeout(shareConnIdle),
		// An acknowledgement the broker refused leaves its record to be
		// delivered again once its lock runs out: logged, not fatal.
		kgo.ShareAckCallback(func(_ *kgo.Client, rs kgo.ShareAckResults) {
			for _, r := range rs {
				if r.Err != nil {
					s.cfg.Logger.Warn("kgopubsub: the broker refused acknowledgements; their records are delivered again", "group", s.cfg.ConsumerGroup, "topic", r.Topic, "partition", r.Partition, "err", r.Err)
				}
			}
		}),
	}
	opts = append(opts, SecurityOptions(s.cfg.Security)...)
	// Each copy goes to the partition of the record it copies, whatever
	// partitioner the Options name: a copy is known as one only there.
	cl, err := kgo.NewClient(append(append(opts, s.cfg.Options...), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return nil, fmt.Errorf("kgopubsub: %w", err)
	}
	if err := checkShareOptions(cl, s.cfg, topic); err != nil {
		cl.Close()
		return nil, err
	}
	conf, err := s.prepareGroup(ctx, cl)
	if err != nil {
		cl.Close()
		return nil, err
	}
	sub := &shareSub{s: s, cl: cl, topic: topic, out: make(chan *message.Message), dead: map[string]struct{}{}}
	sub.maxBytes = topicMaxBytes(ctx, cl, topic, s.cfg.Logger)
	maxBytes.Store(sub.maxBytes)
	if err := sub.setGroupConf(conf); err != nil {
		cl.Close()
		return nil, err
	}
	// The producer ID of the copies, loaded before the first record is
	// fetched rather than between the fetch and the copy.
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("kgopubsub: the share group's member copies records near their last delivery with an idempotent producer, whose producer ID Kafka at %s did not give: %w (the role needs the Write right on the topic, or IdempotentWrite on the cluster)",
			strings.Join(s.cfg.Brokers, ","), err)
	}
	if !s.subs.Start(ctx, sub.out, sub.run) {
		cl.Close()
		return nil, ErrSubscriberClosed
	}
	return sub.out, nil
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

// Share group configuration keys.
const (
	shareAutoOffsetReset = "share.auto.offset.reset"
	shareIsolationLevel  = "share.isolation.level"
	shareDeliveryLimit   = "share.delivery.count.limit"
	defaultDeliveryLimit = 5
	shareVersionFeature  = "share.version"
)

// groupRefresh is how often a subscription reads its share group's
// configuration again: its settings (a member whose settings the group no
// longer has stops), its delivery limit and its record lock.
const groupRefresh = 5 * time.Second

// ErrShareGroupSettings is Subscribe's error, and the cause a running
// subscription ends with, when the share group's start offset or isolation
// level (set on the group, for every member) is not the ShareSubscriber's.
var ErrShareGroupSettings = errors.New("kgopubsub: the share group's settings are not this ShareSubscriber's")

// ErrNoShareGroups is Subscribe's error when the brokers do not serve
// share groups.
var ErrNoShareGroups = errors.New("kgopubsub: the brokers do not serve share groups (KIP-932): they need Kafka 4.2 or later, " +
	"with share groups enabled (the share.version feature at 1 or more: kafka-features.sh upgrade --feature share.version=1)")

// groupConf is a share group's configuration: the values, and which of
// them are set on the group itself (rather than the broker's defaults).
type groupConf struct {
	values map[string]string
	set    map[string]bool
}

// settings are the share group settings s needs, by name.
func (s *ShareSubscriber) settings() map[string]string {
	want := map[string]string{shareAutoOffsetReset: "earliest", shareIsolationLevel: "read_committed"}
	if s.cfg.StartOffset == kafkapubsub.StartLast {
		want[shareAutoOffsetReset] = "latest"
	}
	if s.cfg.Isolation == kafkapubsub.ReadUncommitted {
		want[shareIsolationLevel] = "read_uncommitted"
	}
	return want
}

// settingField names the configuration field behind each setting.
var settingField = map[string]string{shareAutoOffsetReset: "StartOffset", shareIsolationLevel: "Isolation"}

// checkSettings returns an ErrShareGroupSettings error when a setting s
// needs is set on the group to another value: the group's settings apply
// to all its members, and the others depend on them.
func (s *ShareSubscriber) checkSettings(conf groupConf) error {
	var errs []string
	for _, name := range []string{shareAutoOffsetReset, shareIsolationLevel} {
		want := s.settings()[name]
		if conf.set[name] && conf.values[name] != want {
			errs = append(errs, fmt.Sprintf("its %s is %s, and this subscriber's SubscriberConfig.%s needs %s (set it to match, or "+
				"once no member depends on it: kafka-configs.sh --alter --entity-type groups --entity-name %s --add-config %s=%s)",
				name, conf.values[name], settingField[name], want, s.cfg.ConsumerGroup, name, want))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the share group %s's settings apply to every member, and a member does not change them under the others: %s; "+
		"or consume from a share group of its own", ErrShareGroupSettings, s.cfg.ConsumerGroup, strings.Join(errs, "; "))
}

// prepareGroup checks that the brokers serve share groups and that the
// group's start offset and isolation level are the configuration's, sets
// those the group has not set yet (the first member's settings become the
// group's), and returns its configuration.
func (s *ShareSubscriber) prepareGroup(ctx context.Context, cl *kgo.Client) (groupConf, error) {
	av, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		return groupConf{}, fmt.Errorf("kgopubsub: Kafka at %s: %w", strings.Join(s.cfg.Brokers, ","), err)
	}
	served := false
	for _, k := range av.ApiKeys {
		served = served || k.ApiKey == kmsg.ShareGroupHeartbeat.Int16()
	}
	for _, f := range av.FinalizedFeatures {
		if f.Name == shareVersionFeature && f.MaxVersionLevel < 1 {
			served = false
		}
	}
	if !served {
		return groupConf{}, ErrNoShareGroups
	}
	current, err := s.describeGroup(ctx, cl)
	if err != nil {
		return groupConf{}, err
	}
	if err := s.checkSettings(current); err != nil {
		return groupConf{}, err
	}
	want := s.settings()
	set := map[string]string{}
	for name, v := range want {
		if !current.set[name] {
			set[name] = v
		}
	}
	if len(set) == 0 {
		return current, nil
	}
	if err := alterGroupConfig(ctx, cl, s.cfg.ConsumerGroup, set); err != nil {
		return groupConf{}, fmt.Errorf("kgopubsub: set the share group %s's %s and %s: %w (the role needs the AlterConfigs right on the group, or set them beforehand: kafka-configs.sh --alter --entity-type groups --entity-name %s --add-config %s=%s,%s=%s)",
			s.cfg.ConsumerGroup, shareAutoOffsetReset, shareIsolationLevel, err, s.cfg.ConsumerGroup,
			shareAutoOffsetReset, want[shareAutoOffsetReset], shareIsolationLevel, want[shareIsolationLevel])
	}
	// Another member that set them at the same time with other values: the
	// last one set holds, and the other member is refused.
	if current, err = s.describeGroup(ctx, cl); err != nil {
		return groupConf{}, err
	}
	return current, s.checkSettings(current)
}

// alterGroupConfig sets the configurations set of group, and leaves its
// others as they are.
func alterGroupConfig(ctx context.Context, cl *kgo.Client, group string, set map[string]string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	for name, v := range set {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value = name, kmsg.StringPtr(v)
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) != 1 {
		err = errors.New("no answer for the group")
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	return err
}

// describeGroup returns the share group's configuration.
func (s *ShareSubscriber) describeGroup(ctx context.Context, cl *kgo.Client) (groupConf, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, s.cfg.ConsumerGroup
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) != 1 {
		err = errors.New("no answer for the group")
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		return groupConf{}, fmt.Errorf("kgopubsub: read the share group %s's configuration: %w (the role needs the DescribeConfigs right on the group)", s.cfg.ConsumerGroup, err)
	}
	out := groupConf{values: map[string]string{}, set: map[string]bool{}}
	for _, c := range resp.Resources[0].Configs {
		if c.Value != nil {
			out.values[c.Name] = *c.Value
			out.set[c.Name] = c.Source == kmsg.ConfigSourceGroupConfig
		}
	}
	return out, nil
}

// setGroupConf keeps the group's delivery limit, and returns
// checkConnIdle's verdict on its record lock (Subscribe refuses it, a
// refresh logs it).
func (sub *shareSub) setGroupConf(conf groupConf) error {
	n, err := strconv.Atoi(conf.values[shareDeliveryLimit])
	if err != nil || n < 1 {
		n = defaultDeliveryLimit
	}
	sub.limit.Store(int32(n))
	return checkConnIdle(sub.cl, sub.s.cfg.ConsumerGroup, conf.values)
}

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

// reject rejects r, dead-lettered, and remembers its command, whose
// origin is from.
func (sub *shareSub) reject(r *kgo.Record, from string) {
	sub.mu.Lock()
	if len(sub.dead) >= maxDead {
		clear(sub.dead)
	}
	sub.dead[from] = struct{}{}
	sub.mu.Unlock()
	r.Ack(kgo.AckReject)
}

// rejected says whether the command whose origin is from was dead-lettered
// here before.
func (sub *shareSub) rejected(from string) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	_, ok := sub.dead[from]
	return ok
}

// run polls at most MaxInFlight records, hands each to the handler until
// it is acknowledged, and polls again once every one of them is: franz-go
// accepts at the next poll whatever the last one returned and was not
// acknowledged, which would accept a record still being applied. It
// returns when ctx, the subscription's, ends.
func (sub *shareSub) run(ctx context.Context) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	sub.ctx = ctx
	s := sub.s
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
		defer cancel()
		if err := sub.cl.FlushAcks(fctx); err != nil {
			s.cfg.Logger.Warn("kgopubsub: the share group's last acknowledgements were not sent; their records are delivered again once their locks run out", "group", s.cfg.ConsumerGroup, "err", err)
		}
		sub.cl.Close()
	}()
	refreshed := time.Now()
	for sub.ctx.Err() == nil {
		// The poll waits until the group's configuration is due to be read
		// again at most, so that an idle member sees its changes too.
		pctx, cancel := context.WithDeadline(sub.ctx, refreshed.Add(groupRefresh))
		fs := sub.cl.PollRecords(pctx, s.cfg.MaxInFlight)
		cancel()
		if sub.ctx.Err() == nil {
			fs.EachError(func(t string, p int32, err error) {
				if !errors.Is(err, context.DeadlineExceeded) {
					s.cfg.Logger.Warn("kgopubsub: share group fetch failed; retrying", "group", s.cfg.ConsumerGroup, "topic", t, "partition", p, "err", err)
				}
			})
		}
		if sub.ctx.Err() == nil && time.Since(refreshed) >= groupRefresh {
			refreshed = time.Now()
			if err := sub.refresh(); err != nil {
				// The records were fetched under settings this member does
				// not have (read uncommitted, say, for a member that must
				// not apply aborted records): released to the group's
				// other members, not handed out.
				s.cfg.Logger.Error("kgopubsub: the share group's settings changed under this member: its subscription ends (a worker stops; restarted, it is refused until the settings match)",
					"group", s.cfg.ConsumerGroup, "topic", sub.topic, "err", err)
				fs.EachRecord(func(r *kgo.Record) { r.Ack(kgo.AckRelease) })
				stop()
				return
			}
		}
		// After the subscription ended, deliver copies what must be copied
		// and releases the rest.
		var wg sync.WaitGroup
		fs.EachRecord(func(r *kgo.Record) {
			wg.Add(1)
			go func() { defer wg.Done(); sub.deliver(r) }()
		})
		wg.Wait()
	}
}

// refresh reads the share group's configuration again: it returns an
// ErrShareGroupSettings error when the group's settings are no longer the
// subscription's, and keeps its delivery limit and record lock.
func (sub *shareSub) refresh() error {
	conf, err := sub.s.describeGroup(sub.ctx, sub.cl)
	if err != nil {
		if sub.ctx.Err() == nil {
			sub.s.cfg.Logger.Warn("kgopubsub: could not read the share group's configuration again", "err", err)
		}
		return nil
	}
	if err := sub.s.checkSettings(conf); err != nil {
		return err
	}
	if err := sub.setGroupConf(conf); err != nil {
		sub.s.cfg.Logger.Warn("kgopubsub: the share group's record lock changed", "err", err)
	}
	return nil
}

// copyFrom is the delivery from which a record is copied before it is
// handed out, for a group whose delivery limit is limit: its last two
// deliveries (but never its first), so that a record is archived only if
// the members holding both of them die before copying it.
func copyFrom(limit int32) int32 { return max(2, limit-1) }

// shareConnIdle is how long a share group member's connection may stay
// idle before it is closed: above any lock a record is held for.
const shareConnIdle = 5 * time.Minute

// shareRecordLock is the group configuration that bounds how long a
// member holds a record it was handed.
const shareRecordLock = "share.record.lock.duration.ms"

// checkConnIdle refuses a client whose idle connection timeout (a
// kgo.ConnIdleTimeout in the Options) is not above the group's record
// lock: while a handler runs within its lock, the member's connection may
// be idle; closed, it ends the member's share session, and the broker
// releases every record the member holds, to be delivered again.
func checkConnIdle(cl *kgo.Client, group string, conf map[string]string) error {
	idle, _ := cl.OptValue(kgo.ConnIdleTimeout).(time.Duration)
	ms, err := strconv.ParseInt(conf[shareRecordLock], 10, 64)
	if err != nil {
		return nil // not reported: the broker's default, below shareConnIdle
	}
	lock := time.Duration(ms) * time.Millisecond
	if idle > lock {
		return nil
	}
	why := fmt.Sprintf("a handler that runs longer than %v would lose the records its member holds (franz-go closes the idle connection, "+
		"which ends the member's share session), and they would be delivered again", idle)
	if idle == shareConnIdle {
		return fmt.Errorf("kgopubsub: the share group %s's %s (%v) is not below the subscriber's idle connection timeout (%v): %s; "+
			"put a kgo.ConnIdleTimeout above the lock in SubscriberConfig.Options", group, shareRecordLock, lock, idle, why)
	}
	return fmt.Errorf("kgopubsub: the Options' kgo.ConnIdleTimeout (%v) is not above the share group %s's %s (%v): %s; "+
		"leave it out (the subscriber sets %v) or set it above the lock", idle, group, shareRecordLock, lock, why, shareConnIdle)
}

// checkShareOptions refuses franz-go options in cfg.Options that undo
// what the share group's member needs of its client (ConnIdleTimeout,
// which depends on the group's lock, is checkConnIdle's).
func checkShareOptions(cl *kgo.Client, cfg SubscriberConfig, topic string) error {
	var errs []string
	if n, _ := cl.OptValue(kgo.MaxConcurrentFetches).(int); n != 0 {
		errs = append(errs, fmt.Sprintf("kgo.MaxConcurrentFetches(%d) fetches ahead of the handlers: the records it acquires wait in a buffer while their locks run out, "+
			"and the broker hands them to other members; leave it out (the subscriber fetches only when it polls)", n))
	}
	if n, _ := cl.OptValue(kgo.ShareMaxRecords).(int32); int(n) != cfg.MaxInFlight {
		errs = append(errs, fmt.Sprintf("kgo.ShareMaxRecords(%d) is not MaxInFlight (%d): records acquired beyond what is handed out wait while their locks run out; "+
			"set SubscriberConfig.MaxInFlight instead", n, cfg.MaxInFlight))
	}
	if g, _ := cl.OptValue(kgo.ShareGroup).(string); g != cfg.ConsumerGroup {
		errs = append(errs, fmt.Sprintf("kgo.ShareGroup(%q) is not SubscriberConfig.ConsumerGroup (%q): set ConsumerGroup instead", g, cfg.ConsumerGroup))
	}
	if ts, _ := cl.OptValue(kgo.ConsumeTopics).([]string); len(ts) != 1 || ts[0] != topic {
		errs = append(errs, fmt.Sprintf("kgo.ConsumeTopics makes the member consume %v: a subscription consumes the topic given to Subscribe (%s) alone; leave it out", ts, topic))
	}
	if re, _ := cl.OptValue(kgo.ConsumeRegex).(bool); re {
		errs = append(errs, "kgo.ConsumeRegex: a subscription consumes the topic given to Subscribe alone; leave it out")
	}
	if d, _ := cl.OptValue(kgo.ProducerLinger).(time.Duration); d != 0 {
		errs = append(errs, fmt.Sprintf("kgo.ProducerLinger(%v) delays the copies of records near their last delivery, and a member killed meanwhile loses them; leave it out", d))
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && acks != kgo.AllISRAcks() {
		errs = append(errs, "kgo.RequiredAcks other than kgo.AllISRAcks: a copy of a record near its last delivery that the leader alone holds is lost with it, and the record with it; leave it out")
	}
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		errs = append(errs, "kgo.DisableIdempotentWrite: the copies of records near their last delivery need the idempotent producer (a retried copy is appended once); leave it out")
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("kgopubsub: SubscriberConfig.Options for the share group %s: %s", cfg.ConsumerGroup, strings.Join(errs, "; "))
}

// lockMargin is how much of a record's lock must be left for the handler
// to get it again after a Nack; with less, the record is released to the
// group.
const lockMargin = time.Second

// copyTimeout bounds the copy of a record near its last delivery.
const copyTimeout = 30 * time.Second

// deliver hands r to the handler until it is acknowledged, or released.
func (sub *shareSub) deliver(r *kgo.Record) {
	s := sub.s
	offset := originOffset(r)
	from := originAt(r, offset)
	if sub.rejected(from) {
		// Dead-lettered in an earlier delivery whose Reject came after its
		// lock ran out.
		r.Ack(kgo.AckReject)
		return
	}
	deliveries := priorDeliveries(r) + int(r.DeliveryCount())
	// Once r is copied, a delivery that does not succeed accepts it rather
	// than releasing it: the copy carries the command on, and r is copied
	// again only when the member holding it dies.
	letGo := kgo.AckRelease
	if copyFrom(sub.limit.Load()) <= r.DeliveryCount() && sub.copyAhead(r, deliveries, from) {
		// The copy carries the command on: r is accepted at once, before
		// its handler runs, so that a handler that kills its process (an
		// OOM) leaves the copy alone, not r released to be copied again
		// (each death would add a copy, without bound).
		letGo = kgo.AckAccept
		r.Ack(kgo.AckAccept)
		fctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), copyTimeout)
		if err := sub.cl.FlushAcks(fctx); err != nil {
			s.cfg.Logger.Warn("kgopubsub: a copied record's acceptance was not sent: if its member dies, it is copied again", "group", s.cfg.ConsumerGroup,
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
		}
		cancel()
	}
	backoff := s.cfg.NackBackoff
	for {
		msg := toWatermill(r)
		msg.Metadata[MetadataDeliveryCount] = strconv.Itoa(deliveries)
		mctx, cancel := context.WithCancel(context.WithoutCancel(sub.ctx))
		mctx = dedupe.ContextWithDeliveries(withArrived(mctx, r), deliveries)
		// A copy carries its original's coordinates: keys made of them
		// (consumer.KeyFromOffset, MissingKey Derive) are the original's.
		msg.SetContext(dedupe.ContextWithSource(mctx, dedupe.Source{Topic: r.Topic, Partition: r.Partition, Offset: offset}))
		if sub.ctx.Err() != nil {
			// Ended: never handed out, even to a reader that is ready.
			cancel()
			r.Ack(letGo)
			return
		}
		select {
		case sub.out <- msg:
		case <-sub.ctx.Done():
			cancel()
			r.Ack(letGo)
			return
		}
		acked, done := sub.await(msg)
		cancel()
		switch {
		case !done:
			r.Ack(letGo)
			return
		case acked && deadLettered(msg, r):
			sub.reject(r, from)
			return
		case acked:
			r.Ack(kgo.AckAccept)
			return
		}
		if sub.ctx.Err() != nil || time.Until(r.AcquisitionDeadline()) < backoff+lockMargin {
			r.Ack(letGo)
			return
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-sub.ctx.Done():
			t.Stop()
			r.Ack(letGo)
			return
		}
		backoff = min(2*backoff, s.cfg.MaxNackBackoff)
	}
}

// await waits for msg's Ack or Nack; after the subscription ends, for up
// to DrainTimeout. done is false when neither came.
func (sub *shareSub) await(msg *message.Message) (acked, done bool) {
	select {
	case <-msg.Acked():
		return true, true
	case <-msg.Nacked():
		return false, true
	case <-sub.ctx.Done():
	}
	t := time.NewTimer(sub.s.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-msg.Acked():
		return true, true
	case <-msg.Nacked():
		return false, true
	case <-t.C:
		return false, false
	}
}

// deadLettered says whether msg was dead-lettered while it was delivered:
// middleware.PoisonQueue set a reason the record did not arrive with.
func deadLettered(msg *message.Message, r *kgo.Record) bool {
	reason := msg.Metadata.Get(middleware.ReasonForPoisonedKey)
	if reason == "" {
		return false
	}
	for _, h := range r.Headers {
		if h.Key == middleware.ReasonForPoisonedKey && string(h.Value) == reason {
			return false
		}
	}
	return true
}

// copyAhead copies r, whose origin is from, unchanged but for its count of
// deliveries and its origin, to the
// end of its partition, before one of its last deliveries: the broker
// archives a record whose last delivery fails (a crash, a lock that runs
// out, a release), and the copy carries the command on. A process killed
// between the fetch and the copy (a produce's round trip) leaves the
// record to its next delivery, which copies it if there is one. It tries
// for up to copyTimeout, even past r's lock (the copy matters, not the
// delivery) and after Close. It says whether the copy was made.
func (sub *shareSub) copyAhead(r *kgo.Record, deliveries int, from string) bool {
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+2)
	for _, h := range r.Headers {
		if !mdkeys.ShareHeader(h.Key) {
			headers = append(headers, h)
		}
	}
	headers = append(headers,
		kgo.RecordHeader{Key: mdkeys.ShareDeliveries, Value: []byte(strconv.Itoa(deliveries))},
		kgo.RecordHeader{Key: mdkeys.ShareOrigin, Value: []byte(from)})
	// The copy gets the time of its append: a topic whose brokers refuse
	// old timestamps would refuse the record's own.
	cp := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: headers}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), copyTimeout)
	defer cancel()
	start := time.Now()
	produce := func() error { return sub.cl.ProduceSync(ctx, cp).FirstErr() }
	if recordBytes(cp) > int(sub.maxBytes) {
		// Over the topic's limit uncompressed, as franz-go checks it: a
		// record its producer compressed below it. Copied compressed,
		// through a client of its own whose batches the broker alone
		// bounds (it checks them compressed).
		produce = func() error { return sub.copyCompressed(ctx, cp) }
	}
	for {
		err := produce()
		if err == nil {
			sub.s.cfg.Logger.Info("kgopubsub: a record near its last delivery was copied to the end of its partition", "group", sub.s.cfg.ConsumerGroup,
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "delivery", r.DeliveryCount(), "took", time.Since(start))
			return true
		}
		if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
			// No retry makes it smaller.
			sub.s.cfg.Logger.Error("kgopubsub: MESSAGE_TOO_LARGE: a record near its last delivery could not be copied, its copy is over the topic's max.message.bytes "+
				"(compressed with zstd when larger uncompressed): if its last delivery fails too, the broker archives it; raise the topic's max.message.bytes",
				"group", sub.s.cfg.ConsumerGroup, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
				"value_bytes", len(r.Value), "max_message_bytes", sub.maxBytes, "err", err)
			return false
		}
		if ctx.Err() != nil {
			hint := ""
			if errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) {
				hint = " (the role needs the Write right on the topic)"
			}
			sub.s.cfg.Logger.Error("kgopubsub: a record near its last delivery could not be copied"+hint+": if its last delivery fails too, the broker archives it",
				"group", sub.s.cfg.ConsumerGroup, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
			return false
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// recordBytes is about how many bytes franz-go counts r for, uncompressed.
func recordBytes(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + 64
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}

// compressedCopyMax bounds a compressed copy's batch, uncompressed: the
// broker checks it, compressed, against the topic's max.message.bytes.
const compressedCopyMax = 64 << 20

// copyCompressed produces cp compressed with zstd, through a client of its
// own (an idempotent producer too) whose batches may be as large as
// compressedCopyMax uncompressed.
func (sub *shareSub) copyCompressed(ctx context.Context, cp *kgo.Record) error {
	opts := append(SecurityOptions(sub.s.cfg.Security), kgo.SeedBrokers(sub.s.cfg.Brokers...), kgo.WithLogger(kgoLogger{sub.s.cfg.Logger}),
		kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.ZstdCompression()),
		kgo.ProducerBatchMaxBytes(compressedCopyMax), kgo.BrokerMaxWriteBytes(compressedCopyMax+1<<20),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, cp).FirstErr()
}

// defaultMaxMessageBytes is Kafka's default max.message.bytes.
const defaultMaxMessageBytes = 1048588

// topicMaxBytes returns topic's max.message.bytes (bounded by what the
// client writes to a broker at most), or Kafka's default when it cannot be
// read (logged).
func topicMaxBytes(ctx context.Context, cl *kgo.Client, topic string, log *slog.Logger) int32 {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	res.ConfigNames = []string{"max.message.bytes"}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) != 1 {
		err = errors.New("no answer for the topic")
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	n := int64(-1)
	if err == nil {
		for _, c := range resp.Resources[0].Configs {
			if c.Name == "max.message.bytes" && c.Value != nil {
				n, err = strconv.ParseInt(*c.Value, 10, 32)
			}
		}
	}
	if err != nil || n < 1 {
		log.Warn("kgopubsub: could not read the topic's max.message.bytes (the role needs the DescribeConfigs right on the topic): "+
			"records near their last delivery are copied in batches of up to Kafka's default", "topic", topic, "default", defaultMaxMessageBytes, "err", err)
		return defaultMaxMessageBytes
	}
	if limit, ok := cl.OptValue(kgo.BrokerMaxWriteBytes).(int32); ok && int64(limit) < n {
		n = int64(limit)
	}
	return int32(max(n, 512))
}

// originOffset is the offset of the record r copies, or r's own: a header
// that names another topic or partition, or no earlier offset, is not a
// copy's (a record copied from another topic as it was, say).
func originOffset(r *kgo.Record) int64 {
	for _, h := range r.Headers {
		if h.Key != mdkeys.ShareOrigin {
			continue
		}
		parts := strings.Split(string(h.Value), "/")
		if len(parts) != 3 || parts[0] != r.Topic || parts[1] != strconv.Itoa(int(r.Partition)) {
			return r.Offset
		}
		if o, err := strconv.ParseInt(parts[2], 10, 64); err == nil && o >= 0 && o < r.Offset {
			return o
		}
	}
	return r.Offset
}

// originAt names the record at offset of r's partition.
func originAt(r *kgo.Record, offset int64) string {
	return r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(offset, 10)
}

// priorDeliveries is how many times the records r copies were delivered.
func priorDeliveries(r *kgo.Record) int {
	for _, h := range r.Headers {
		if h.Key == mdkeys.ShareDeliveries {
			n, _ := strconv.Atoi(string(h.Value))
			return max(n, 0)
		}
	}
	return 0
}
