package kgopubsub

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/delivery"
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

// Close stops every subscription, waits for in-flight messages to drain (up
// to DrainTimeout), commits and leaves the group (a static member, with
// InstanceID, does not leave). It is idempotent.
func (s *Subscriber) Close() error {
	s.subs.Close()
	return nil
}

func (s *Subscriber) log() *slog.Logger { return s.cfg.Logger }

// delivery is what each partition's delivery takes of the configuration.
func (s *Subscriber) delivery() delivery.Config {
	c := s.cfg
	return delivery.Config{MaxInFlight: c.MaxInFlight, KeyOrdered: c.KeyOrdered, NackBackoff: c.NackBackoff, MaxNackBackoff: c.MaxNackBackoff,
		DrainTimeout: c.DrainTimeout, Logger: c.Logger, Name: "kgopubsub"}
}

// pauseAt is how many polled records of a partition may wait for its
// goroutine before its fetching pauses.
func (s *Subscriber) pauseAt() int { return max(1024, 2*delivery.LookaheadFactor*s.cfg.MaxInFlight) }

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
	// epochs are the epochs of the member's claims of its partitions
	// (kafkapubsub.PositionClaims), which fence its saves; lostParts are
	// the partitions another member claimed since, whose offsets are
	// neither saved nor committed until this member claims them again
	// (Kafka takes them from it once it hears from it).
	epochs    map[int]int64
	lostParts map[int32]bool
	// committed and marked are Kafka's committed offsets of the partitions
	// being assigned and whether they carry positionsMarker.
	committed map[int32]int64
	marked    map[int32]bool
}

// commitTimeout bounds one commit (and the positions' save before it).
const commitTimeout = 10 * time.Second

// groupErrHook keeps the error that ended a member's group session (a
// join the broker refused, say), until the member is assigned again.
type groupErrHook struct{ m *member }

// OnGroupManageError implements kgo.HookGroupManageError.
func (h groupErrHook) OnGroupManageError(err error) {
	h.m.mu.Lock()
	h.m.groupErr = err
	h.m.mu.Unlock()
}
