package kgopubsub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Subscribe starts consuming topic, as a member of ConsumerGroup of its own
// (one per call). The channel closes when ctx is done or the Subscriber is
// closed, after in-flight messages have drained and acked offsets have been
// committed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("kgopubsub: Subscribe: topic is empty")
	}
	out := make(chan *message.Message)
	started := s.subs.Start(ctx, out, func(ctx context.Context) {
		if s.cfg.ConsumerGroup == "" {
			s.runDirect(ctx, topic, out)
			return
		}
		for ctx.Err() == nil {
			m := &member{s: s, topic: topic, out: out, subCtx: ctx, parts: map[int32]*partition{},
				pending: map[int32]int64{}, expected: map[int32]int64{}, rewind: make(chan struct{})}
			s.mu.Lock()
			s.members[topic] = m
			s.mu.Unlock()
			if !m.run(ctx) {
				return
			}
		}
	})
	if !started {
		return nil, ErrSubscriberClosed
	}
	return out, nil
}

// Health returns nil, or why a subscription's member is not in its group:
// the broker refused its last attempt to join and it has not joined since
// (INCONSISTENT_GROUP_PROTOCOL when the group's members assign with
// another balancer, as a fleet on kafkapubsub does, whose range franz-go's
// cooperative-sticky does not share). The worker reports it in its Health
// ("consumer"): such a member consumes nothing, though it runs.
func (s *Subscriber) Health() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, topic := range slices.Sorted(maps.Keys(s.members)) {
		m := s.members[topic]
		m.mu.Lock()
		err := m.groupErr
		m.mu.Unlock()
		if err == nil {
			continue
		}
		hint := ""
		if errors.Is(err, kerr.InconsistentGroupProtocol) {
			hint = " (the group's members assign with a balancer this one does not have: a fleet on kafkapubsub, say; " +
				"switch transports by stopping every member of the group before starting the new ones: docs/transports.md)"
		}
		errs = append(errs, fmt.Errorf("kgopubsub: the member for topic %s cannot join the group %s: %w%s", topic, s.cfg.ConsumerGroup, err, hint))
	}
	return errors.Join(errs...)
}

// runDirect reads every partition of topic from StartOffset and commits
// nothing.
func (s *Subscriber) runDirect(ctx context.Context, topic string, out chan<- *message.Message) {
	cl, err := kgo.NewClient(append(s.clientOpts(topic), s.cfg.Options...)...)
	if err != nil {
		s.log().Error("kgopubsub: cannot create client", "topic", topic, "err", err)
		return
	}
	defer cl.Close()
	parts := map[int32]*partition{}
	stopCtx, stop := context.WithCancel(ctx)
	defer func() {
		stop()
		for _, p := range parts {
			<-p.done
		}
	}()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				s.log().Warn("kgopubsub: fetch failed; retrying", "topic", t, "partition", p, "err", err)
			}
		})
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			p, ok := parts[fp.Partition]
			if !ok {
				p = newPartition(cl, topic, fp.Partition, s.pauseAt())
				parts[fp.Partition] = p
				go consume(s.delivery(), ctx, stopCtx, p, out, func(int64) {})
			}
			p.push(fp.Records)
		})
	}
}

// run joins the group and consumes until ctx ends (false) or the
// database's positions went back (true: join again).
func (m *member) run(ctx context.Context) bool {
	s := m.s
	balancer := kgo.CooperativeStickyBalancer()
	opts := append(s.clientOpts(m.topic),
		kgo.ConsumerGroup(s.cfg.ConsumerGroup),
		kgo.Balancers(balancer),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.SessionTimeout(s.cfg.SessionTimeout),
		kgo.RebalanceTimeout(s.cfg.RebalanceTimeout),
		kgo.HeartbeatInterval(s.cfg.HeartbeatInterval),
		kgo.OnPartitionsAssigned(m.assigned),
		kgo.OnPartitionsRevoked(m.revoked),
		kgo.OnPartitionsLost(m.lost),
		kgo.WithHooks(groupErrHook{m}),
	)
	if s.cfg.GroupProtocol == ProtocolConsumer {
		opts = append(opts, kgo.ServerSideBalancer())
	}
	if s.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(s.cfg.InstanceID))
	}
	if s.cfg.Positions != nil {
		opts = append(opts, kgo.OnOffsetsFetched(m.offsetsFetched), kgo.AdjustFetchOffsetsFn(m.adjustOffsets))
	}
	cl, err := kgo.NewClient(append(opts, s.cfg.Options...)...)
	if err != nil {
		s.log().Error("kgopubsub: cannot create group client", "group", s.cfg.ConsumerGroup, "topic", m.topic, "err", err)
		return false
	}
	m.mu.Lock()
	m.cl = cl
	m.mu.Unlock()
	pollCtx, stopPolling := context.WithCancel(ctx)
	go func() {
		select {
		case <-m.rewind:
			stopPolling()
		case <-pollCtx.Done():
		}
	}()
	var committer sync.WaitGroup
	if s.cfg.CommitInterval > 0 {
		committer.Add(1)
		go func() {
			defer committer.Done()
			t := time.NewTicker(s.cfg.CommitInterval)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					m.commit(nil)
				case <-pollCtx.Done():
					return
				}
			}
		}()
	}
	for {
		fs := cl.PollFetches(pollCtx)
		if pollCtx.Err() != nil || fs.IsClientClosed() {
			cl.AllowRebalance()
			break
		}
		replaced := false
		fs.EachError(func(t string, p int32, err error) {
			switch {
			case errors.Is(err, kerr.FencedInstanceID):
				replaced = true
			case !errors.Is(err, context.Canceled):
				s.log().Warn("kgopubsub: fetch failed; retrying", "group", s.cfg.ConsumerGroup, "topic", t, "partition", p, "err", err)
			}
		})
		if replaced {
			// Another member joined with this member's InstanceID: the
			// broker refuses every join and commit of this one from now on,
			// so it stops rather than idle (its subscription ends).
			s.log().Error("kgopubsub: another member joined the group with this member's InstanceID, and the broker fenced this one: "+
				"it stops consuming; give every running member an InstanceID of its own", "group", s.cfg.ConsumerGroup, "topic", m.topic,
				"instance_id", s.cfg.InstanceID)
			cl.AllowRebalance()
			break
		}
		m.mu.Lock()
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if p, ok := m.parts[fp.Partition]; ok && fp.Topic == m.topic {
				p.push(fp.Records)
			}
		})
		m.mu.Unlock()
		cl.AllowRebalance()
	}
	stopPolling()
	committer.Wait()
	// Every partition drains and its acked offsets are committed (unless
	// fenced) while the member still owns it; then the member leaves (a
	// static one stays, for its restart).
	m.stopPartitions(m.all(), true)
	cl.Close()
	select {
	case <-m.rewind:
		return ctx.Err() == nil
	default:
		return false
	}
}
