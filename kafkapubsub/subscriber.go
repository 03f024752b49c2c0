package kafkapubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/clock"
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
	if o.StartOffset == 0 {
		o.StartOffset = StartFirst
	}
	if o.StartOffset != StartFirst && o.StartOffset != StartLast {
		return o, fmt.Errorf("kafkapubsub: SubscriberConfig.StartOffset is %d: use StartFirst or StartLast", o.StartOffset)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.NackBackoff, 100*time.Millisecond)
	def(&o.MaxNackBackoff, 5*time.Second)
	def(&o.SessionTimeout, 10*time.Second)
	def(&o.RebalanceTimeout, 30*time.Second)
	def(&o.DrainTimeout, min(10*time.Second, o.RebalanceTimeout/2))
	def(&o.HeartbeatInterval, time.Second)
	def(&o.MaxWait, 250*time.Millisecond)
	def(&o.CommitInterval, 200*time.Millisecond)
	if o.MaxInFlight == 0 {
		o.MaxInFlight = 1
	}
	if o.MaxInFlight < 0 {
		return o, fmt.Errorf("kafkapubsub: SubscriberConfig.MaxInFlight is %d: set 1 or more (1 is one message per partition at a time)", o.MaxInFlight)
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = 10 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	for name, d := range map[string]time.Duration{"NackBackoff": o.NackBackoff, "MaxNackBackoff": o.MaxNackBackoff,
		"DrainTimeout": o.DrainTimeout, "SessionTimeout": o.SessionTimeout, "RebalanceTimeout": o.RebalanceTimeout,
		"HeartbeatInterval": o.HeartbeatInterval, "MaxWait": o.MaxWait} {
		if d < 0 {
			return o, fmt.Errorf("kafkapubsub: SubscriberConfig.%s is %v: set a positive duration", name, d)
		}
	}
	if o.DrainTimeout >= o.RebalanceTimeout {
		return o, fmt.Errorf("kafkapubsub: SubscriberConfig.DrainTimeout (%v) is not below RebalanceTimeout (%v): the group would finish the rebalance without this member and refuse its last commit; lower DrainTimeout or raise RebalanceTimeout", o.DrainTimeout, o.RebalanceTimeout)
	}
	if o.HeartbeatInterval >= o.SessionTimeout {
		return o, fmt.Errorf("kafkapubsub: SubscriberConfig.HeartbeatInterval (%v) is not below SessionTimeout (%v): lower HeartbeatInterval (a third of SessionTimeout or less)", o.HeartbeatInterval, o.SessionTimeout)
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
	closing    chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex
	closed     bool
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a Subscriber. cfg is required for its Brokers.
func NewSubscriber(cfg *SubscriberConfig) (*Subscriber, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Subscriber{cfg: c, transports: map[string]*kafka.Transport{}, closing: make(chan struct{})}, nil
}

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("kafkapubsub: subscriber closed")

// Subscribe starts consuming topic. The channel closes when ctx is done or
// the Subscriber is closed, after in-flight messages have drained.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("kafkapubsub: Subscribe: topic is empty")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrSubscriberClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer cancel()
		go func() {
			select {
			case <-s.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		if s.cfg.ConsumerGroup != "" {
			s.runGroup(ctx, topic, out)
		} else {
			s.runWithoutGroup(ctx, topic, out)
		}
	}()
	return out, nil
}

// Close stops every subscription, waits for in-flight messages to drain
// (up to DrainTimeout), commits and leaves the group. It is idempotent.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.wg.Wait()
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

func (s *Subscriber) runGroup(ctx context.Context, topic string, out chan<- *message.Message) {
	// A group joined before its topic exists settles on a generation with no
	// partitions, and kafka-go's partition watcher, whose first look may
	// already see the new topic, never asks for another: join once the
	// topic is there.
	if _, ok := s.waitForTopic(ctx, topic); !ok {
		return
	}
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                    s.cfg.ConsumerGroup,
		Brokers:               s.cfg.Brokers,
		Dialer:                s.cfg.Security.dialer(10 * time.Second),
		Topics:                []string{topic},
		StartOffset:           int64(s.cfg.StartOffset),
		SessionTimeout:        s.cfg.SessionTimeout,
		RebalanceTimeout:      s.cfg.RebalanceTimeout,
		HeartbeatInterval:     s.cfg.HeartbeatInterval,
		JoinGroupBackoff:      time.Second,
		WatchPartitionChanges: true,
		Timeout:               10 * time.Second,
		ErrorLogger:           kafkaLogger(s.log(), slog.LevelDebug),
	})
	if err != nil {
		s.log().Error("kafkapubsub: cannot create consumer group", "group", s.cfg.ConsumerGroup, "topic", topic, "err", err)
		return
	}
	// Closing the group ends the current generation: its partitions drain
	// and commit before Close returns.
	stop := context.AfterFunc(ctx, func() { _ = cg.Close() })
	defer stop()
	defer cg.Close()
	bo := retryBackoff()
	for {
		gen, err := cg.Next(ctx)
		if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
			return
		}
		if err != nil {
			pause := bo.Next()
			s.log().Warn("kafkapubsub: joining group failed; retrying", "group", s.cfg.ConsumerGroup, "topic", topic, "err", err, "backoff", pause)
			if clock.Sleep(ctx, pause) != nil {
				return
			}
			continue
		}
		bo.Reset()
		s.runGeneration(ctx, gen, topic, out)
	}
}

// offsets holds each partition's next offset to commit, for one generation.
type offsets struct {
	mu      sync.Mutex
	pending map[int]int64
}

func (o *offsets) set(partition int, next int64) {
	o.mu.Lock()
	o.pending[partition] = next
	o.mu.Unlock()
}

func (o *offsets) take() map[int]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.pending) == 0 {
		return nil
	}
	p := o.pending
	o.pending = map[int]int64{}
	return p
}

func (o *offsets) putBack(p map[int]int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for part, off := range p {
		if cur, ok := o.pending[part]; !ok || off > cur {
			o.pending[part] = off
		}
	}
}

// runGeneration starts a reader per assigned partition and a committer, all
// bound to gen: when the generation ends they drain, commit and return.
func (s *Subscriber) runGeneration(ctx context.Context, gen *kafka.Generation, topic string, out chan<- *message.Message) {
	st := &offsets{pending: map[int]int64{}}
	commit := func() {
		p := st.take()
		if p == nil {
			return
		}
		if err := gen.CommitOffsets(map[string]map[int]int64{topic: p}); err != nil {
			// The next owner re-reads from the last commit; the dedupe
			// middleware absorbs the redelivery.
			s.log().Warn("kafkapubsub: commit failed", "group", s.cfg.ConsumerGroup, "topic", topic, "generation", gen.ID, "offsets", p, "err", err)
			st.putBack(p)
		}
	}
	var partitions sync.WaitGroup
	assigned := gen.Assignments[topic]
	s.log().Debug("kafkapubsub: generation started", "group", s.cfg.ConsumerGroup, "topic", topic, "generation", gen.ID, "partitions", len(assigned))
	for _, a := range assigned {
		partitions.Add(1)
		gen.Start(func(gctx context.Context) {
			defer partitions.Done()
			s.consumePartition(ctx, gctx, topic, a.ID, a.Offset, out, func(next int64) {
				st.set(a.ID, next)
				if s.cfg.CommitInterval < 0 {
					commit()
				}
			})
		})
	}
	gen.Start(func(gctx context.Context) {
		defer func() {
			// The generation ended: keep the membership alive while the
			// partitions drain, so that a drain longer than SessionTimeout
			// does not get this member expelled and its last commit refused.
			stop := s.heartbeat(gen, topic)
			partitions.Wait()
			commit()
			stop()
		}()
		if s.cfg.CommitInterval > 0 {
			t := time.NewTicker(s.cfg.CommitInterval)
			defer t.Stop()
		loop:
			for {
				select {
				case <-t.C:
					commit()
				case <-gctx.Done():
					break loop
				}
			}
		} else {
			<-gctx.Done()
		}
	})
}

// heartbeat sends heartbeats for gen's member until stop is called. The
// coordinator answers "rebalance in progress" while the group waits for its
// members to rejoin, and each heartbeat keeps this member's session alive.
func (s *Subscriber) heartbeat(gen *kafka.Generation, topic string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Timeout: 10 * time.Second, Transport: s.transport(topic)}
		var coord net.Addr
		t := time.NewTicker(s.cfg.HeartbeatInterval)
		defer t.Stop()
		for {
			if coord == nil {
				res, err := c.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: gen.GroupID, KeyType: kafka.CoordinatorKeyTypeConsumer})
				if err == nil && res.Error == nil && res.Coordinator != nil {
					coord = kafka.TCP(net.JoinHostPort(res.Coordinator.Host, strconv.Itoa(res.Coordinator.Port)))
				}
			}
			if coord != nil {
				res, err := c.Heartbeat(ctx, &kafka.HeartbeatRequest{Addr: coord, GroupID: gen.GroupID, GenerationID: gen.ID, MemberID: gen.MemberID})
				if err == nil {
					err = res.Error
				}
				switch {
				case ctx.Err() != nil:
					return
				case err == nil, errors.Is(err, kafka.RebalanceInProgress):
				case errors.Is(err, kafka.UnknownMemberId), errors.Is(err, kafka.IllegalGeneration), errors.Is(err, kafka.FencedInstanceID):
					s.log().Warn("kafkapubsub: membership lost while draining; the last commit will be refused", "group", gen.GroupID, "generation", gen.ID, "err", err)
					return
				default:
					s.log().Debug("kafkapubsub: heartbeat while draining failed", "group", gen.GroupID, "generation", gen.ID, "err", err)
					coord = nil
				}
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}

// consumePartition reads one partition in order and delivers it through a
// window of up to MaxInFlight messages (see [window]). subCtx carries the
// subscription's values into message contexts; stopCtx ends the reading,
// after which the in-flight messages drain. acked is called with the next
// offset to commit each time the watermark moves: after acks, and after a
// run of hidden records (transaction markers, aborted records).
func (s *Subscriber) consumePartition(subCtx, stopCtx context.Context, topic string, partition int, start int64, out chan<- *message.Message, acked func(next int64)) {
	f := &fetcher{
		transport: s.transport(topic), addr: kafka.TCP(s.cfg.Brokers...), topic: topic, partition: partition,
		committed: s.cfg.Isolation == ReadCommitted, maxBytes: s.cfg.MaxBytes, maxWait: s.cfg.MaxWait,
	}
	pos, ok := s.resolveOffset(stopCtx, topic, partition, start)
	if !ok {
		return
	}
	// The next response is fetched while this one is delivered.
	ctx, cancel := context.WithCancel(stopCtx)
	responses := make(chan fetched, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.fetchLoop(ctx, f, pos, responses)
	}()
	defer func() { cancel(); <-done }()

	w := newWindow(s.cfg.MaxInFlight, s.cfg.KeyOrdered, pos)
	// Each entry in flight has at most one event on its way (its ack or
	// nack, then its back-off's end), so sends never wait.
	events := make(chan windowEvent, s.cfg.MaxInFlight)
	quit := make(chan struct{})
	defer close(quit)
	committed := pos
	report := func() {
		if wm := w.watermark(); wm > committed {
			committed = wm
			acked(committed)
		}
	}
	var res fetched
	taken, pending := 0, false // records of res taken into w; res not fully taken
	withHandler := 0           // entries delivered and not yet acked or nacked
	var unwatched []*entry     // of those, the ones without a watch goroutine
	for {
		for pending && taken < len(res.records) && !w.full() {
			w.add(res.records[taken], s.cfg.NackBackoff)
			taken++
		}
		if pending && taken == len(res.records) {
			// Hidden records after the last one: commit past them, or the
			// partition looks lagging forever when its tail is a
			// transaction marker.
			w.skip(res.next)
			res, pending = fetched{}, false
		}
		report()
		var in <-chan fetched
		if !pending {
			in = responses
		}
		var send chan<- *message.Message
		var msg *message.Message
		e := w.next()
		if e != nil {
			if e.msg == nil {
				s.prepare(subCtx, e)
			}
			send, msg = out, e.msg
		}
		// One message with the handler (always so with MaxInFlight 1) is
		// waited for here; several get a goroutine each that reports its
		// ack or nack as an event.
		var direct *entry
		var ackedCh, nackedCh <-chan struct{}
		if withHandler == 1 && len(unwatched) == 1 {
			direct = unwatched[0]
			ackedCh, nackedCh = direct.msg.Acked(), direct.msg.Nacked()
		} else {
			for _, u := range unwatched {
				go watch(u, u.msg, events, quit)
			}
			unwatched = unwatched[:0]
		}
		select {
		case res = <-in:
			taken, pending = 0, true
		case send <- msg:
			w.sent(e)
			withHandler++
			unwatched = append(unwatched, e)
		case <-ackedCh:
			unwatched, withHandler = unwatched[:0], withHandler-1
			s.handle(w, windowEvent{e: direct, msg: direct.msg, acked: true}, events, quit)
		case <-nackedCh:
			unwatched, withHandler = unwatched[:0], withHandler-1
			s.handle(w, windowEvent{e: direct, msg: direct.msg}, events, quit)
		case ev := <-events:
			if ev.msg != nil {
				withHandler--
			}
			s.handle(w, ev, events, quit)
		case <-stopCtx.Done():
			for _, u := range unwatched {
				go watch(u, u.msg, events, quit)
			}
			s.drain(w, events)
			report()
			return
		}
	}
}

// windowEvent says that the delivery msg of e was acked or nacked, or (msg
// nil) that e's back-off is over.
type windowEvent struct {
	e     *entry
	msg   *message.Message
	acked bool
}

// prepare makes e's next delivery, its context carrying the record's
// coordinates.
func (s *Subscriber) prepare(subCtx context.Context, e *entry) {
	km := e.km
	msg := toWatermill(km)
	ctx, cancel := context.WithCancel(context.WithoutCancel(subCtx))
	msg.SetContext(dedupe.ContextWithSource(ctx, dedupe.Source{Topic: km.Topic, Partition: int32(km.Partition), Offset: km.Offset}))
	e.msg, e.cancel = msg, cancel
}

// watch reports msg's ack or nack.
func watch(e *entry, msg *message.Message, events chan<- windowEvent, quit <-chan struct{}) {
	var ev windowEvent
	select {
	case <-msg.Acked():
		ev = windowEvent{e: e, msg: msg, acked: true}
	case <-msg.Nacked():
		ev = windowEvent{e: e, msg: msg}
	case <-quit:
		return
	}
	select {
	case events <- ev:
	case <-quit:
	}
}

// handle applies an event to w while the partition runs.
func (s *Subscriber) handle(w *window, ev windowEvent, events chan<- windowEvent, quit <-chan struct{}) {
	e := ev.e
	if ev.msg == nil {
		e.retry = nil
		w.retry(e)
		return
	}
	e.cancel()
	e.msg, e.cancel = nil, nil
	if ev.acked {
		w.acked(e)
		return
	}
	w.nacked(e)
	e.retry = time.AfterFunc(e.backoff, func() {
		select {
		case events <- windowEvent{e: e}:
		case <-quit:
		}
	})
	e.backoff = min(2*e.backoff, s.cfg.MaxNackBackoff)
}

// drain waits, up to DrainTimeout, for the messages of w that are with the
// handler, and gives up the rest: a message given up (not acked in time,
// nacked, or waiting for its back-off) is delivered again to the
// partition's next owner, from the watermark on.
func (s *Subscriber) drain(w *window, events <-chan windowEvent) {
	withHandler := 0
	for _, e := range w.entries {
		switch e.state {
		case delivered:
			withHandler++
		case backingOff:
			e.retry.Stop()
		}
	}
	defer func() {
		for _, e := range w.entries {
			if e.cancel != nil {
				e.cancel()
			}
		}
	}()
	if withHandler == 0 {
		return
	}
	// The handlers may be committing right now.
	t := time.NewTimer(s.cfg.DrainTimeout)
	defer t.Stop()
	for withHandler > 0 {
		select {
		case ev := <-events:
			if ev.msg == nil || ev.e.state != delivered {
				continue // a back-off ended: that message is given up
			}
			withHandler--
			ev.e.cancel()
			ev.e.msg, ev.e.cancel = nil, nil
			if ev.acked {
				w.acked(ev.e)
			} else {
				ev.e.state = backingOff
			}
		case <-t.C:
			for _, e := range w.entries {
				if e.state == delivered {
					s.log().Warn("kafkapubsub: in-flight message not acked within DrainTimeout; it will be delivered again",
						"topic", e.km.Topic, "partition", e.km.Partition, "offset", e.km.Offset, "uuid", e.msg.UUID)
				}
			}
			return
		}
	}
}

// fetchLoop fetches f's partition from pos and sends every response that
// moves the position on, until ctx ends.
func (s *Subscriber) fetchLoop(ctx context.Context, f *fetcher, pos int64, responses chan<- fetched) {
	bo := retryBackoff()
	for {
		res, err := f.fetch(ctx, pos)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, kafka.OffsetOutOfRange) {
			// Retention removed the records at pos (or the topic was
			// recreated): start again where a new group would.
			next, ok := s.resolveOffset(ctx, f.topic, f.partition, int64(s.cfg.StartOffset))
			if !ok {
				return
			}
			s.log().Warn("kafkapubsub: offset out of range; starting again at StartOffset", "topic", f.topic, "partition", f.partition, "offset", pos, "restart", next)
			pos = next
			continue
		}
		if err != nil {
			s.log().Warn("kafkapubsub: fetch failed; retrying", "topic", f.topic, "partition", f.partition, "offset", pos, "err", err)
			if bo.Sleep(ctx) != nil {
				return
			}
			continue
		}
		bo.Reset()
		if res.next == pos && len(res.records) == 0 {
			continue
		}
		select {
		case responses <- res:
		case <-ctx.Done():
			return
		}
		pos = res.next
	}
}

// resolveOffset turns StartFirst and StartLast into an offset of partition,
// retrying until it succeeds or ctx ends (ok false).
func (s *Subscriber) resolveOffset(ctx context.Context, topic string, partition int, start int64) (int64, bool) {
	if start >= 0 {
		return start, true
	}
	c := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Timeout: 10 * time.Second, Transport: s.transport(topic)}
	isolation := kafka.ReadUncommitted
	if s.cfg.Isolation == ReadCommitted {
		isolation = kafka.ReadCommitted
	}
	for bo := retryBackoff(); ; {
		req := kafka.FirstOffsetOf(partition)
		if start == kafka.LastOffset {
			req = kafka.LastOffsetOf(partition)
		}
		res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {req}}, IsolationLevel: isolation})
		if err == nil {
			for _, p := range res.Topics[topic] {
				switch {
				case p.Partition != partition:
				case p.Error != nil:
					err = p.Error
				case start == kafka.LastOffset:
					return p.LastOffset, true
				default:
					return p.FirstOffset, true
				}
			}
			if err == nil {
				err = fmt.Errorf("no offsets for partition %d", partition)
			}
		}
		s.log().Warn("kafkapubsub: list offsets failed; retrying", "topic", topic, "partition", partition, "err", err)
		if bo.Sleep(ctx) != nil {
			return 0, false
		}
	}
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
