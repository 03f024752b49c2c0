package kgopubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/internal/subscriptions"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// Subscriber is a Watermill subscriber on franz-go (kgo) with the contract
// of kafkapubsub's: see the package documentation.
type Subscriber struct {
	cfg  SubscriberConfig
	subs *subscriptions.Set
	mu   sync.Mutex
	// members holds each subscription's current group member, by topic.
	members map[string]*member
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a Subscriber. cfg is required for its Brokers.
func NewSubscriber(cfg *SubscriberConfig) (*Subscriber, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Subscriber{cfg: c, subs: subscriptions.New(), members: map[string]*member{}}, nil
}

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("kgopubsub: subscriber closed")

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

// groupErrHook keeps the error that ended a member's group session (a
// join the broker refused, say), until the member is assigned again.
type groupErrHook struct{ m *member }

// OnGroupManageError implements kgo.HookGroupManageError.
func (h groupErrHook) OnGroupManageError(err error) {
	h.m.mu.Lock()
	h.m.groupErr = err
	h.m.mu.Unlock()
}

// Close stops every subscription, waits for in-flight messages to drain (up
// to DrainTimeout), commits and leaves the group (a static member, with
// InstanceID, does not leave). It is idempotent.
func (s *Subscriber) Close() error {
	s.subs.Close()
	return nil
}

func (s *Subscriber) log() *slog.Logger { return s.cfg.Logger }

// pauseAt is how many polled records of a partition may wait for its
// goroutine before its fetching pauses.
func (s *Subscriber) pauseAt() int { return max(1024, 2*lookaheadFactor*s.cfg.MaxInFlight) }

// partitionWatch is how often a Subscriber's clients refresh the topic's
// metadata, and so find partitions added to it.
const partitionWatch = 5 * time.Second

// clientOpts are the options every client of the Subscriber starts with.
func (s *Subscriber) clientOpts(topic string) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(s.cfg.MaxWait),
		kgo.FetchMaxPartitionBytes(int32(s.cfg.MaxBytes)),
		kgo.FetchMaxBytes(int32(max(s.cfg.MaxBytes, 50<<20))),
		kgo.WithLogger(kgoLogger{s.log()}),
		// Partitions added to the topic are found at a metadata refresh:
		// every 5s, as kafka-go's group watches them, instead of franz-go's
		// default 5m, during which their records would wait unconsumed.
		kgo.MetadataMaxAge(partitionWatch),
	}
	if s.cfg.Isolation == kafkapubsub.ReadCommitted {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	} else {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	}
	if s.cfg.StartOffset == kafkapubsub.StartLast {
		opts = append(opts, kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()))
	} else {
		opts = append(opts, kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	}
	return append(opts, SecurityOptions(s.cfg.Security)...)
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
				go s.consume(ctx, stopCtx, p, out, func(int64) {})
			}
			p.push(fp.Records)
		})
	}
}

// member is one client's membership of the group for one subscription.
// Every partition it is assigned gets a goroutine (see consume); a
// revoked partition drains and its acked offsets are committed before the
// revocation completes, and a lost one drains and commits nothing. Polls
// and rebalances exclude each other (BlockRebalanceOnPoll), so records are
// handed only to partitions the member owns, and a commit is only ever of
// offsets acked in the assignment that fetched them.
type member struct {
	s      *Subscriber
	topic  string
	out    chan<- *message.Message
	subCtx context.Context
	cl     *kgo.Client

	mu    sync.Mutex // guards parts, pending and groupErr
	parts map[int32]*partition
	// groupErr is the error that ended the member's last group session,
	// until it is assigned partitions again (see Health).
	groupErr error
	// pending holds each owned partition's next offset to commit.
	pending map[int32]int64

	commitMu sync.Mutex // one commit at a time; guards the rest
	// expected is the least position the database must hold per
	// partition (Positions); fenced says it was found holding less, after
	// which nothing is committed and the member starts again (rewind).
	expected map[int32]int64
	fenced   bool
	rewind   chan struct{}
	// committed and marked are Kafka's committed offsets of the partitions
	// being assigned and whether they carry positionsMarker.
	committed map[int32]int64
	marked    map[int32]bool
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

// assigned starts a goroutine per partition of the member's topic.
func (m *member) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.groupErr = nil // joined (franz-go calls it after every join, even with nothing new)
	for _, id := range assigned[m.topic] {
		if _, ok := m.parts[id]; ok {
			continue
		}
		p := newPartition(cl, m.topic, id, m.s.pauseAt())
		stopCtx, stop := context.WithCancel(context.WithoutCancel(m.subCtx))
		p.stop = stop
		m.parts[id] = p
		go m.s.consume(m.subCtx, stopCtx, p, m.out, func(next int64) { m.acked(id, next) })
	}
	m.s.log().Debug("kgopubsub: partitions assigned", "group", m.s.cfg.ConsumerGroup, "topic", m.topic, "partitions", assigned[m.topic])
}

// acked records partition's watermark, to commit.
func (m *member) acked(partition int32, next int64) {
	m.mu.Lock()
	if _, ok := m.parts[partition]; ok {
		m.pending[partition] = next
	}
	m.mu.Unlock()
	if m.s.cfg.CommitInterval < 0 {
		m.commit(nil)
	}
}

// revoked drains the revoked partitions, commits what they acked and
// forgets them: the next owner starts at the commit.
func (m *member) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	m.stopPartitions(revoked[m.topic], true)
}

// lost drains the lost partitions and forgets them without committing: the
// membership that fetched them is gone, and so is the right to commit.
func (m *member) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	m.stopPartitions(lost[m.topic], false)
}

func (m *member) all() []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]int32, 0, len(m.parts))
	for id := range m.parts {
		ids = append(ids, id)
	}
	return ids
}

func (m *member) stopPartitions(ids []int32, commit bool) {
	var ps []*partition
	m.mu.Lock()
	for _, id := range ids {
		if p, ok := m.parts[id]; ok {
			ps = append(ps, p)
		}
	}
	m.mu.Unlock()
	if len(ps) == 0 {
		return
	}
	for _, p := range ps {
		p.stop()
	}
	for _, p := range ps {
		<-p.done
	}
	if commit {
		m.commit(ids)
	}
	m.mu.Lock()
	for _, p := range ps {
		delete(m.parts, p.id)
		delete(m.pending, p.id)
	}
	m.mu.Unlock()
	m.commitMu.Lock()
	for _, p := range ps {
		delete(m.expected, p.id)
	}
	m.commitMu.Unlock()
	for _, p := range ps {
		p.resume()
	}
	m.s.log().Debug("kgopubsub: partitions given up", "group", m.s.cfg.ConsumerGroup, "topic", m.topic, "partitions", ids, "committed", commit)
}

// commitTimeout bounds one commit (and the positions' save before it).
const commitTimeout = 10 * time.Second

// commit commits the pending offsets of owned partitions: with Positions,
// the database's positions first, then Kafka's. A failed commit leaves
// them pending for the next, except those of mustCommit (partitions being
// revoked), which are reported and given up: their next owner starts at
// the last commit, and the dedupe store absorbs the redelivery.
func (m *member) commit(mustCommit []int32) {
	m.commitMu.Lock()
	defer m.commitMu.Unlock()
	if m.fenced {
		return
	}
	m.mu.Lock()
	p := m.pending
	m.pending = map[int32]int64{}
	m.mu.Unlock()
	if len(p) == 0 {
		return
	}
	s := m.s
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	putBack := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for part, off := range p {
			if _, owned := m.parts[part]; !owned {
				continue
			}
			if cur, ok := m.pending[part]; !ok || off > cur {
				m.pending[part] = off
			}
		}
	}
	if s.cfg.Positions != nil {
		offs, exp := map[int]int64{}, map[int]int64{}
		for part, off := range p {
			offs[int(part)] = off
			if e, ok := m.expected[part]; ok {
				exp[int(part)] = e
			}
		}
		behind, err := s.cfg.Positions.Save(ctx, s.cfg.ConsumerGroup, m.topic, offs, exp)
		if err != nil {
			s.log().Warn("kgopubsub: saving positions failed; not committing to Kafka either", "group", s.cfg.ConsumerGroup, "topic", m.topic, "offsets", p, "err", err)
			putBack()
			return
		}
		if len(behind) > 0 {
			m.fenced = true
			close(m.rewind)
			s.log().Warn("kgopubsub: the database's positions went back while consuming (a failover or a restore lost commits); "+
				"starting the partitions again from the database's positions", "group", s.cfg.ConsumerGroup, "topic", m.topic,
				"db_positions", behind, "expected", exp)
			return
		}
		for part, off := range p {
			m.expected[part] = off
		}
		ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
			marker := positionsMarker
			for i := range req.Topics {
				for j := range req.Topics[i].Partitions {
					req.Topics[i].Partitions[j].Metadata = &marker
				}
			}
			return nil
		})
	}
	offsets := make(map[int32]kgo.EpochOffset, len(p))
	for part, off := range p {
		offsets[part] = kgo.EpochOffset{Epoch: -1, Offset: off}
	}
	var cerr error
	m.cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{m.topic: offsets},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				cerr = err
				return
			}
			for _, t := range resp.Topics {
				for _, rp := range t.Partitions {
					if perr := kerrOf(rp.ErrorCode); perr != nil {
						cerr = errors.Join(cerr, fmt.Errorf("partition %d: %w", rp.Partition, perr))
					}
				}
			}
		})
	if cerr != nil {
		s.log().Warn("kgopubsub: commit failed", "group", s.cfg.ConsumerGroup, "topic", m.topic, "offsets", p, "revoking", mustCommit, "err", cerr)
		putBack()
	}
}
