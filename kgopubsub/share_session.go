package kgopubsub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"
)

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
