// Package pubsubtest holds what the tests of both Kafka transports
// (kafkapubsub, kgopubsub) share: their logger, the configurations of the
// pub/subs Watermill's universal suite runs on, and that suite's run.
package pubsubtest

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// QuietLogger logs errors only, or everything with EXACTLY_TEST_DEBUG set.
func QuietLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("EXACTLY_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// Configs are the configurations of a publisher and a subscriber of the
// suite on brokers, the subscriber in group.
func Configs(brokers []string, group string) (kafkapubsub.PublisherConfig, kafkapubsub.SubscriberConfig) {
	return kafkapubsub.PublisherConfig{
			Brokers:                brokers,
			AllowAutoTopicCreation: true,
			// Messages of one kind share a key, so they share a partition and keep their order.
			PartitionKeyFunc: func(_ string, m *message.Message) (string, error) { return string(m.Payload), nil },
			Logger:           QuietLogger(),
		}, kafkapubsub.SubscriberConfig{
			Brokers:          brokers,
			ConsumerGroup:    group,
			NackBackoff:      10 * time.Millisecond,
			MaxNackBackoff:   10 * time.Millisecond,
			SessionTimeout:   6 * time.Second,
			RebalanceTimeout: 10 * time.Second,
			DrainTimeout:     5 * time.Second,
			Logger:           QuietLogger(),
		}
}

// Suite runs Watermill's universal Pub/Sub test suite on the pub/subs
// newPubSubOn makes (pkg is the transport's package path, for the skip's
// hint). Its TestReconnect restarts the broker twice while 100 publishers
// write 10,000 messages and a subscriber reads them, and requires every
// message read: it runs on a broker of its own (restarted on its data by
// scripts/kafka.sh restart), the others on the shared one. That test reads
// a slice that a goroutine of its own appends to, a data race in the suite
// rather than in the transport: under the race detector (race) it skips,
// and scripts/test.sh (make test) runs it again without it.
func Suite(t *testing.T, race bool, pkg string, newPubSubOn func(t *testing.T, brokers []string, group string) (message.Publisher, message.Subscriber)) {
	own := kafkatest.PrepareOwn(t, nil)
	var started sync.Once
	features := tests.Features{
		ConsumerGroups:                   true,
		ExactlyOnceDelivery:              false,
		GuaranteedOrder:                  true,
		Persistent:                       true,
		NewSubscriberReceivesOldMessages: true,
		RestartServiceCommand:            own.Restart,
	}
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return newPubSubOn(t, kafkatest.Brokers(t), group)
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			// Subscribers made for one test share a group, so several of
			// them split the partitions instead of each reading everything.
			// In Kafka a new subscriber sees old messages only in a new
			// group: that test gets one group per subscriber.
			name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
			if strings.Contains(name, "TestNewSubscriberReceivesOldMessages") {
				name = kafkatest.Name(name)
			}
			if strings.Contains(name, "TestReconnect") {
				if race {
					t.Skip("Watermill's TestReconnect races on its own slice of published messages: run it without -race " +
						"(go test -run 'TestPubSub$/TestReconnect' " + pkg + "; make test does)")
				}
				started.Do(func() {
					own.Start(t)
					// Before the broker stops (cleanups run last first): the
					// suite's restarts did restart it.
					t.Cleanup(func() {
						// A restart may still be writing the pid file.
						pid, err := own.RunningPID()
						for end := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(end); pid, err = own.RunningPID() {
							time.Sleep(100 * time.Millisecond)
						}
						if err != nil || pid == own.PID {
							t.Errorf("the broker of TestReconnect still runs as pid %d (%v): RestartServiceCommand never restarted it", own.PID, err)
						}
					})
				})
				return newPubSubOn(t, []string{own.Addr}, "ps-"+name)
			}
			return newPubSub(t, "ps-"+name)
		},
		newPubSub,
	)
}
