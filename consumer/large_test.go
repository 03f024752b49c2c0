package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

const fiveMiB = 5 << 20

// setMaxMessageBytes sets topic's max.message.bytes.
func setMaxMessageBytes(t testing.TB, brokers []string, topic string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	res, err := c.IncrementalAlterConfigs(ctx, &kafka.IncrementalAlterConfigsRequest{Resources: []kafka.IncrementalAlterConfigsRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic,
		Configs: []kafka.IncrementalAlterConfigsRequestConfig{{Name: "max.message.bytes", Value: strconv.Itoa(n), ConfigOperation: kafka.ConfigOperationSet}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Resources {
		if r.Error != nil {
			t.Fatal(r.Error)
		}
	}
}

// bigCommand is a command record padded to about size bytes.
func bigCommand(uuid, account string, amount int64, size int) kafka.Message {
	m := record(uuid, account, amount)
	m.Value = append(bytes.TrimSuffix(m.Value, []byte("}")), `,"pad":"`+strings.Repeat("x", size)+`"}`...)
	return m
}

// A key reused by a record over 1 MiB is dead-lettered (the dead-letter
// topic takes 5 MiB), and the partition moves on.
func TestLargeKeyReusedRecordIsDeadLettered(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	w := newWorld(t, 1)
	setMaxMessageBytes(t, w.brokers, w.topic, fiveMiB)
	setMaxMessageBytes(t, w.brokers, w.dlq, fiveMiB)
	u := watermill.NewUUID()
	small := record(u, "acc-1", 5)
	big := bigCommand(u, "acc-1", 5, 2<<20)
	wr := &kafka.Writer{Addr: kafka.TCP(w.brokers...), Topic: w.topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, BatchSize: 1, BatchBytes: 10 << 20}
	defer wr.Close()
	if err := wr.WriteMessages(context.Background(), small); err != nil {
		t.Fatal(err)
	}
	// The topic's new limit reaches the partition leader shortly after the
	// change is accepted.
	testenv.WaitFor(t, 30*time.Second, "the topic to take a 2 MiB record", func() bool {
		return wr.WriteMessages(context.Background(), big) == nil
	})
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(map[string]command{u: {Account: "acc-1", Amount: 5}})
	dl := w.readTopic(w.dlq)
	if len(dl) != 1 || len(dl[0].Value) != len(big.Value) || header(dl[0], kafkapubsub.UUIDHeader) != u {
		t.Fatalf("dead-letter topic holds %d record(s), want the one large record", len(dl))
	}
	if header(dl[0], "reason_poisoned") == "" {
		t.Fatal("the dead-lettered record has no reason")
	}
}

// A record too large says which limit it hit: the Publisher's own, or the
// topic's max.message.bytes. Under both, a record over 1 MiB is published.
func TestPublishTooLargeSaysWhichLimit(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	roomy, strict := kafkatest.Topic(t, 1), kafkatest.Topic(t, 1)
	setMaxMessageBytes(t, brokers, roomy, fiveMiB)
	setMaxMessageBytes(t, brokers, strict, 1<<20)
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, MaxRecordBytes: 3 << 20, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msg := func(size int) *message.Message {
		return message.NewMessage(watermill.NewUUID(), bytes.Repeat([]byte("y"), size))
	}
	err = pub.Publish(roomy, msg(4<<20))
	if !errors.Is(err, kafkapubsub.ErrRecordTooLarge) || !strings.Contains(err.Error(), "MaxRecordBytes") {
		t.Fatalf("over MaxRecordBytes: got %v, want ErrRecordTooLarge naming MaxRecordBytes", err)
	}
	err = pub.Publish(strict, msg(2<<20))
	if !errors.Is(err, kafkapubsub.ErrRecordTooLarge) || !strings.Contains(err.Error(), "max.message.bytes=") {
		t.Fatalf("over the topic's limit: got %v, want ErrRecordTooLarge naming the topic's max.message.bytes", err)
	}
	// Small records around a large one keep their order.
	a, big, b := msg(10), msg(2<<20), msg(10)
	testenv.WaitFor(t, 30*time.Second, "the topic to take a 2 MiB record", func() bool {
		return pub.Publish(roomy, big) == nil
	})
	if err := pub.Publish(roomy, a, big, b); err != nil {
		t.Fatal(err)
	}
	got := kafkatest.ReadAll(t, roomy, 1, time.Minute)
	var uuids []string
	for _, m := range got {
		uuids = append(uuids, header(m, kafkapubsub.UUIDHeader))
	}
	if want := []string{big.UUID, a.UUID, big.UUID, b.UUID}; strings.Join(uuids, ",") != strings.Join(want, ",") {
		t.Fatalf("records %v, want %v", uuids, want)
	}
}
