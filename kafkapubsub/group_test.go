package kafkapubsub_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// resettingBroker listens on a loopback port, accepts every connection,
// reads the first request and resets the connection: a proxy or a load
// balancer in front of a Kafka node that is gone.
func resettingBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				_, _ = c.Read(make([]byte, 512))
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// A broker first in the list that accepts connections and fails every
// request does not keep the group from joining: kafka-go's group asks the
// first broker that accepts a connection for its coordinator, so the
// subscriber tries the others after a failed join.
func TestGroupJoinsPastABrokerThatResets(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions, n = 2, 40
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	subtest.ProduceKeyed(t, brokers, topic, n, 8)
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
		Brokers: append([]string{resettingBroker(t)}, brokers...), ConsumerGroup: group, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	timeout := time.After(90 * time.Second)
	for got := 0; got < n; {
		select {
		case m := <-ch:
			m.Ack()
			got++
		case <-timeout:
			t.Fatalf("%d of %d messages consumed in 90s: the group did not join past the broker that resets", got, n)
		}
	}
	subtest.WaitCommitted(t, group, topic, partitions, time.Minute)
}
