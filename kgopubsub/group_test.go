package kgopubsub_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

func admin(t *testing.T) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(t)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// requireKIP848 skips t on a broker that does not serve the KIP-848
// consumer group protocol (generally available from Kafka 4.0; the
// matrix's 3.9 lists its APIs but answers UNSUPPORTED_VERSION).
func requireKIP848(t *testing.T) {
	t.Helper()
	if v := os.Getenv("KAFKA_VERSION"); v != "" && v < "4" { // 3.x: the matrix's KAFKA_VERSION
		t.Skipf("Kafka %s: the KIP-848 consumer group protocol is generally available from Kafka 4.0", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ds, err := admin(t).DescribeConsumerGroups(ctx, "exactly-kip848-probe")
	if err == nil {
		err = ds["exactly-kip848-probe"].Err
	}
	if errors.Is(err, kerr.UnsupportedVersion) {
		t.Skipf("the broker does not serve the KIP-848 consumer group protocol (Kafka 4.0 or later; KAFKA_VERSION=%q): %v", os.Getenv("KAFKA_VERSION"), err)
	}
}

// checkProtocol checks that group runs protocol with members members: a
// classic group with the cooperative-sticky assignor, or a KIP-848
// consumer group that ConsumerGroupDescribe knows.
func checkProtocol(t *testing.T, group string, protocol kgopubsub.GroupProtocol, members int) {
	t.Helper()
	adm := admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if protocol == kgopubsub.ProtocolConsumer {
		ds, err := adm.DescribeConsumerGroups(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		d := ds[group]
		if d.Err != nil || len(d.Members) != members {
			t.Fatalf("ConsumerGroupDescribe of %s: err %v, %d members, want a KIP-848 group of %d", group, d.Err, len(d.Members), members)
		}
		return
	}
	ds, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	d := ds[group]
	if d.Err != nil || d.ProtocolType != "consumer" || d.Protocol != "cooperative-sticky" || len(d.Members) != members {
		t.Fatalf("group %s: err %v, protocol type %q, assignor %q, %d members; want a classic cooperative-sticky group of %d",
			group, d.Err, d.ProtocolType, d.Protocol, len(d.Members), members)
	}
}

// generation waits for sub's member of topic to hold a generation and
// returns it.
func generation(t *testing.T, sub *kgopubsub.Subscriber, topic string) int32 {
	t.Helper()
	var g int32
	testenv.WaitFor(t, time.Minute, "the member to join", func() bool {
		_, gen, ok := kgopubsub.GroupGeneration(sub, topic)
		g = gen
		return ok && gen > 0
	})
	return g
}

// settled waits until group is Stable with its partitions shared by two
// members, a and b holding the same generation (a cooperative rebalance
// takes two rounds: the second gives the partitions the first revoked).
func settled(t *testing.T, group string, partitions int, a, b *kgopubsub.Subscriber, topic string) {
	t.Helper()
	adm := admin(t)
	testenv.WaitFor(t, time.Minute, "the group to settle with both members", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ds, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return false
		}
		d := ds[group]
		if d.State != "Stable" || len(d.Members) != 2 {
			return false
		}
		total := 0
		for _, m := range d.Members {
			c, ok := m.Assigned.AsConsumer()
			if !ok {
				return false
			}
			n := 0
			for _, tp := range c.Topics {
				n += len(tp.Partitions)
			}
			if n == 0 {
				return false
			}
			total += n
		}
		_, ga, okA := kgopubsub.GroupGeneration(a, topic)
		_, gb, okB := kgopubsub.GroupGeneration(b, topic)
		return total == partitions && okA && okB && ga == gb
	})
}

// A static member (InstanceID) that stops and comes back within the
// session timeout gets its partitions back with no rebalance: the group
// generation that the other member holds does not move, and every record
// is delivered once. The same restart of a dynamic member does move it
// (the control that shows the generation is watched).
func TestStaticMemberRestartDoesNotRebalance(t *testing.T) {
	for _, static := range []bool{true, false} {
		name := "dynamic"
		if static {
			name = "static"
		}
		t.Run(name, func(t *testing.T) {
			kafkatest.RequireReal(t)
			t.Parallel()
			brokers := kafkatest.Brokers(t)
			const partitions, n = 4, 400
			topic := kafkatest.Topic(t, partitions)
			group := kafkatest.Name("g")
			subtest.ProduceKeyed(t, brokers, topic, n, 40)
			cfg := func(id string) kgopubsub.SubscriberConfig {
				c := kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
					Brokers: brokers, ConsumerGroup: group, SessionTimeout: 30 * time.Second, HeartbeatInterval: time.Second,
					RebalanceTimeout: 30 * time.Second,
				}}
				if static {
					c.InstanceID = group + "-" + id
				}
				return c
			}
			c := &counter{got: map[[2]int64]int{}}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := func(id string) *kgopubsub.Subscriber {
				s := subscriber(t, cfg(id))
				ch, err := s.Subscribe(ctx, topic)
				if err != nil {
					t.Fatal(err)
				}
				go consume(ch, c, 0)
				return s
			}
			b := start("b")
			generation(t, b, topic)
			a := start("a")
			settled(t, group, partitions, a, b, topic)
			subtest.WaitCommitted(t, group, topic, partitions, time.Minute)
			before := generation(t, b, topic)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			a = start("a")
			subtest.ProduceKeyed(t, brokers, topic, n, 40)
			subtest.WaitCommitted(t, group, topic, partitions, time.Minute)
			after := generation(t, b, topic)
			afterA := generation(t, a, topic)
			if static && (after != before || afterA != before) {
				t.Fatalf("static restart: generation %d before, %d after (restarted member %d): the group rebalanced", before, after, afterA)
			}
			if !static && after == before {
				t.Fatalf("dynamic restart: generation stayed %d: the test does not see rebalances", before)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.n != 2*n || len(c.got) != 2*n {
				t.Fatalf("%d deliveries of %d offsets, want %d each", c.n, len(c.got), 2*n)
			}
		})
	}
}
