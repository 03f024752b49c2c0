// Package kafkatest gives tests a Kafka broker, unique topics and groups.
//
// The broker comes from TEST_KAFKA_BROKERS, then KAFKA_BROKERS, then a
// testcontainers-go Kafka when a Docker engine answers (host network,
// 127.0.0.1, free ports), then a broker already
// running on 127.0.0.1:9092 (scripts/kafka.sh start), and last an in-process
// broker (franz-go's kfake), so `go test ./...` runs on a laptop with nothing
// installed. With CI=true the in-process broker is not allowed: CI tests
// against a real Apache Kafka broker, and a missing one fails the test.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// LocalAddr is where a broker started by scripts/kafka.sh listens.
const LocalAddr = "127.0.0.1:9092"

// Image is the Kafka image used with testcontainers (internal/testservices
// starts it); it matches the version in docker-compose.yml and
// scripts/kafka/pom.xml.
const Image = "apache/kafka:4.4.0"

// Kind says where the broker came from.
type Kind string

const (
	KindEnv       = Kind(testenv.SourceEnv)
	KindContainer = Kind(testenv.SourceContainer)
	KindLocal     = Kind(testenv.SourceLocal)
	KindInProcess = Kind(testenv.SourceInProcess)
)

// Broker is the resolved broker.
type Broker struct {
	Addrs []string
	Kind  Kind
	// Why says why the sources before Kind were passed over ("" for none).
	Why string

	where string // the container's description, for KindContainer
}

var broker struct {
	once sync.Once
	b    Broker
	err  error
}

// Resolve finds the broker once per process.
func Resolve() (Broker, error) {
	broker.once.Do(func() { broker.b, broker.err = resolve() })
	return broker.b, broker.err
}

func resolve() (Broker, error) {
	for _, env := range []string{"TEST_KAFKA_BROKERS", "KAFKA_BROKERS"} {
		if v := os.Getenv(env); v != "" {
			addrs := strings.Split(v, ",")
			if err := dial(addrs[0]); err != nil {
				return Broker{}, fmt.Errorf("%s is set but no broker answers at %s: %w", env, addrs[0], err)
			}
			return Broker{Addrs: addrs, Kind: KindEnv, Why: "$" + env}, nil
		}
	}
	var reasons []string
	if ok, why := testenv.DockerAvailable(); ok {
		addr, where, err := testenv.Container("kafka")
		if err == nil {
			return Broker{Addrs: []string{addr}, Kind: KindContainer, where: where}, nil
		}
		reasons = append(reasons, fmt.Sprintf("testcontainers: %v", err))
	} else {
		reasons = append(reasons, fmt.Sprintf("no Docker engine for testcontainers (%v)", why))
	}
	if err := dial(LocalAddr); err == nil {
		return Broker{Addrs: []string{LocalAddr}, Kind: KindLocal, Why: strings.Join(reasons, "; ")}, nil
	}
	reasons = append(reasons, "no broker on "+LocalAddr+" (scripts/kafka.sh start)")
	if testenv.CI() {
		return Broker{}, fmt.Errorf("no real Kafka broker and the in-process one is not allowed under CI: %s", strings.Join(reasons, "; "))
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(),
		kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		return Broker{}, fmt.Errorf("in-process broker: %w (and %s)", err, strings.Join(reasons, "; "))
	}
	return Broker{Addrs: c.ListenAddrs(), Kind: KindInProcess, Why: strings.Join(reasons, "; ")}, nil
}

func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// Brokers returns the broker addresses, skipping t (failing under CI)
// when there is none.
func Brokers(t testing.TB) []string {
	t.Helper()
	b, err := Resolve()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	where := strings.Join(b.Addrs, ",")
	if b.where != "" {
		where = b.where
	}
	if b.Why != "" {
		where += " (" + b.Why + ")"
	}
	testenv.Report(t, "Kafka", testenv.Source(b.Kind), where)
	return b.Addrs
}

// RequireReal skips t on the in-process broker, for tests of behaviour that
// only a real broker has.
func RequireReal(t testing.TB) {
	t.Helper()
	Brokers(t)
	if b, _ := Resolve(); b.Kind == KindInProcess {
		t.Skip("needs a real Kafka broker (scripts/kafka.sh start, or TEST_KAFKA_BROKERS)")
	}
}

// RealParallel is the opening of a parallel test that needs a real broker
// (RequireReal): it marks t parallel and returns the brokers.
func RealParallel(t *testing.T) []string {
	t.Helper()
	RequireReal(t)
	t.Parallel()
	return Brokers(t)
}

// Name returns a unique name with prefix, for topics and groups.
func Name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// Client returns a kafka-go admin client for the broker.
func Client(t testing.TB) *kafka.Client {
	t.Helper()
	return clientOn(Brokers(t))
}

func clientOn(brokers []string) *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
}

// Topic creates a unique topic with n partitions, waits until every
// partition has a leader, and deletes it when t ends.
func Topic(t testing.TB, n int) string {
	t.Helper()
	name := Name("t")
	CreateTopic(t, name, n)
	return name
}

// CreateTopic creates topic with n partitions and waits until it serves.
func CreateTopic(t testing.TB, topic string, n int) {
	t.Helper()
	CreateTopicOn(t, Brokers(t), topic, n)
}

// CreateTopicOn is CreateTopic on the given brokers.
func CreateTopicOn(t testing.TB, brokers []string, topic string, n int) {
	t.Helper()
	c := clientOn(brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: n, ReplicationFactor: 1,
	}}})
	if err != nil {
		t.Fatalf("kafkatest: create topic %s: %v", topic, err)
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		t.Fatalf("kafkatest: create topic %s: %v", topic, err)
	}
	testenv.WaitFor(t, 30*time.Second, "topic "+topic+" to have leaders", func() bool {
		md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) != n {
			return false
		}
		for _, p := range md.Topics[0].Partitions {
			if p.Error != nil || p.Leader.Host == "" {
				return false
			}
		}
		// Metadata names a leader before the leader serves the partition:
		// wait until it answers for every partition.
		_, err = kafkaadmin.EndOffsets(ctx, c, topic, n)
		return err == nil
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	})
}

// CommittedOffsets returns the group's committed offset per partition of
// topic (partitions without a commit are absent). A coordinator that is
// still starting (a fresh broker creates __consumer_offsets on first use) is
// waited for.
func CommittedOffsets(t testing.TB, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	return CommittedOffsetsOn(t, Brokers(t), group, topic, partitions)
}

// CommittedOffsetsOn is CommittedOffsets on the given brokers.
func CommittedOffsetsOn(t testing.TB, brokers []string, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kafkaadmin.Window+10*time.Second)
	defer cancel()
	all, err := kafkaadmin.Committed(ctx, clientOn(brokers), group, topic, partitions)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	out := map[int]int64{}
	for p, o := range all {
		if o >= 0 {
			out[p] = o
		}
	}
	return out
}

// EndOffsets returns the log-end offset of each partition of topic.
func EndOffsets(t testing.TB, topic string, partitions int) map[int]int64 {
	t.Helper()
	return EndOffsetsOn(t, Brokers(t), topic, partitions)
}

// EndOffsetsOn is EndOffsets on the given brokers.
func EndOffsetsOn(t testing.TB, brokers []string, topic string, partitions int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kafkaadmin.Window+10*time.Second)
	defer cancel()
	out, err := kafkaadmin.EndOffsets(ctx, clientOn(brokers), topic, partitions)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	return out
}

// ReadAll reads every record of topic up to its current end offsets and
// returns them in partition order (each partition in offset order).
func ReadAll(t testing.TB, topic string, partitions int, d time.Duration) []kafka.Message {
	t.Helper()
	return ReadAllOn(t, Brokers(t), topic, partitions, d)
}

// ReadAllOn is ReadAll on the given brokers.
func ReadAllOn(t testing.TB, brokers []string, topic string, partitions int, d time.Duration) []kafka.Message {
	t.Helper()
	end := EndOffsetsOn(t, brokers, topic, partitions)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	per := make([][]kafka.Message, partitions)
	errs := make([]error, partitions)
	for p := 0; p < partitions; p++ {
		if end[p] == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond, MaxBytes: 10 << 20})
			defer r.Close()
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					errs[p] = fmt.Errorf("partition %d after %d records: %w", p, len(per[p]), err)
					return
				}
				per[p] = append(per[p], m)
				if m.Offset+1 >= end[p] {
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("kafkatest: read %s: %v", topic, err)
	}
	var out []kafka.Message
	for _, ms := range per {
		out = append(out, ms...)
	}
	return out
}
