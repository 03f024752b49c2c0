package kafkapubsub

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/clock"
)

// runGroup joins the consumer group for topic and runs each generation it
// is given, until ctx ends.
func (s *Subscriber) runGroup(ctx context.Context, topic string, out chan<- *message.Message) {
	// A group joined before its topic exists settles on a generation with no
	// partitions, and kafka-go's partition watcher, whose first look may
	// already see the new topic, never asks for another: join once the
	// topic is there.
	if _, ok := s.waitForTopic(ctx, topic); !ok {
		return
	}
	// kafka-go's group asks the first broker of its list that accepts a
	// connection for the coordinator, every time: a broker that accepts and
	// then fails every request (a proxy or a load balancer in front of a
	// node that is gone) would fail every join until it comes back. After a
	// failed join the group is made again with the list rotated.
	brokers := slices.Clone(s.cfg.Brokers)
	newGroup := func() (*kafka.ConsumerGroup, error) {
		return kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
			ID:                    s.cfg.ConsumerGroup,
			Brokers:               brokers,
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
	}
	cg, err := newGroup()
	if err != nil {
		s.log().Error("kafkapubsub: cannot create consumer group", "group", s.cfg.ConsumerGroup, "topic", topic, "err", err)
		return
	}
	// Closing the group ends the current generation: its partitions drain
	// and commit before Close returns.
	var mu sync.Mutex
	current := cg
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		_ = current.Close()
	})
	defer stop()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		_ = current.Close()
	}()
	bo := retryBackoff()
	started := time.Now()
	for {
		gen, err := cg.Next(ctx)
		if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
			return
		}
		if err != nil {
			pause := bo.Next()
			s.log().Log(ctx, joinFailureLevel(err, time.Since(started)), "kafkapubsub: joining group failed; retrying",
				"group", s.cfg.ConsumerGroup, "topic", topic, "err", err, "backoff", pause)
			if len(brokers) > 1 {
				brokers = append(slices.Clone(brokers[1:]), brokers[0])
				next, nerr := newGroup()
				if nerr == nil {
					mu.Lock()
					_ = current.Close()
					current, cg = next, next
					mu.Unlock()
					if ctx.Err() != nil { // the AfterFunc may have closed the old one only
						return
					}
				}
			}
			if clock.Sleep(ctx, pause) != nil {
				return
			}
			continue
		}
		bo.Reset()
		s.runGeneration(ctx, gen, topic, out)
	}
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

// coordinatorGrace is how long after a subscription starts a failure to
// join that Kafka calls retriable is expected: a fresh broker answers
// "Group Coordinator Not Available" (and "Group Load In Progress")
// while it creates and loads __consumer_offsets, for a few seconds.
const coordinatorGrace = 30 * time.Second

// joinFailureLevel is the level at which a failure to join the group is
// logged, since elapsed after the subscription started: INFO for a
// retriable error within coordinatorGrace, WARN for anything else.
func joinFailureLevel(err error, elapsed time.Duration) slog.Level {
	var ke kafka.Error
	if elapsed < coordinatorGrace && errors.As(err, &ke) && ke.Temporary() {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}
