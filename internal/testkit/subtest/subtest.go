// Package subtest is the subscriber contract suite: the tests of a
// Watermill subscriber on a Kafka consumer group that every transport
// (kafkapubsub on kafka-go, kgopubsub on franz-go) passes. A transport's
// tests run all of it with Run, on a Transport that makes its subscriber.
//
// The exactly-once tests run a worker process of their own: the
// transport's TestMain calls Main.
package subtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// Transport makes a transport's subscriber on a consumer group from the
// configuration the transports share, as worker.Transport does
// (kgopubsub.Transport is one).
type Transport interface {
	NewSubscriber(cfg *kafkapubsub.SubscriberConfig) (message.Subscriber, error)
}

// Variant is a Transport of a transport's other settings (another group
// protocol, static members), which a test binary runs the suite on too; its
// name reaches the worker processes of the exactly-once tests in
// VariantEnv, so that they run it too.
type Variant interface {
	Transport
	Variant() string
}

// A Transport with a method SkipReason(test string) string skips the
// tests of the suite for which it gives a reason.

// VariantEnv names, to a worker process of the exactly-once tests, the
// Variant its parent runs ("" for the transport's default).
const VariantEnv = "EXACTLY_SUBTEST_VARIANT"

// Logger is the suite's logger: errors only, everything with
// EXACTLY_TEST_DEBUG set.
func Logger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("EXACTLY_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// deliveries records which offsets of which partitions were delivered.
type deliveries struct {
	mu  sync.Mutex
	got map[int][]int64
}

func (d *deliveries) of(p int) []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int64(nil), d.got[p]...)
}

// consumeAll runs a Subscriber with cfg on topic that acks every message,
// until stop is called (which closes it: its last commit is done when stop
// returns).
func consumeAll(t *testing.T, tr Transport, cfg *kafkapubsub.SubscriberConfig, topic string) (d *deliveries, stop func()) {
	t.Helper()
	sub, err := tr.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	d = &deliveries{got: map[int][]int64{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			p, _ := strconv.Atoi(m.Metadata.Get(kafkapubsub.MetadataPartition))
			off, _ := strconv.ParseInt(m.Metadata.Get(kafkapubsub.MetadataOffset), 10, 64)
			d.mu.Lock()
			d.got[p] = append(d.got[p], off)
			d.mu.Unlock()
			m.Ack()
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { _ = sub.Close(); <-done }) }
	t.Cleanup(stop)
	return d, stop
}

func offsetRange(from, to int64) []int64 {
	var out []int64
	for o := from; o < to; o++ {
		out = append(out, o)
	}
	return out
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ProduceKeyed writes n records spread over keys, each record's value its
// sequence number within its key, hashed to partitions by key.
func ProduceKeyed(t testing.TB, brokers []string, topic string, n, keys int) {
	t.Helper()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte(fmt.Sprintf("k%03d", i%keys)), Value: []byte(strconv.Itoa(i / keys))}
	}
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, BatchSize: 500}
	defer wr.Close()
	if err := wr.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

// WaitCommitted waits until group has committed every record of topic.
func WaitCommitted(t testing.TB, group, topic string, partitions int, d time.Duration) {
	t.Helper()
	end := kafkatest.EndOffsets(t, topic, partitions)
	testenv.WaitFor(t, d, "the group to commit every record", func() bool {
		c := kafkatest.CommittedOffsets(t, group, topic, partitions)
		for p, o := range end {
			if c[p] != o {
				return false
			}
		}
		return true
	})
}

// Run runs the whole suite on tr, a subtest each.
func Run(t *testing.T, tr Transport) {
	for _, c := range []struct {
		name string
		test func(*testing.T, Transport)
	}{
		{"OrderAndCoordinates", OrderAndCoordinates},
		{"Positions", Positions},
		{"PositionsNeedAGroup", PositionsNeedAGroup},
		{"PositionsRestoreBeforeFirstSave", PositionsRestoreBeforeFirstSave},
		{"PositionsRestoreBeforeFirstSaveApplied", PositionsRestoreBeforeFirstSaveApplied},
		{"PositionsLateSave", PositionsLateSave},
		{"PositionsClaimedByAnother", PositionsClaimedByAnother},
		{"PositionsChurn", PositionsChurn},
		{"PositionsRestoreBelowLogStart", PositionsRestoreBelowLogStart},
		{"KeyOrderedConcurrency", KeyOrderedConcurrency},
		{"WatermarkHoldsCommit", WatermarkHoldsCommit},
		{"KeyOrderedRebalanceExactlyOnce", KeyOrderedRebalanceExactlyOnce},
		{"KeyOrderedKillExactlyOnce", KeyOrderedKillExactlyOnce},
	} {
		t.Run(c.name, func(t *testing.T) {
			if s, ok := tr.(interface{ SkipReason(test string) string }); ok {
				if why := s.SkipReason(c.name); why != "" {
					t.Skip(why)
				}
			}
			c.test(t, tr)
		})
	}
}
