package consumer_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// txProducer is a transactional producer of this project's choosing
// (franz-go), writing to partition 0 of topic.
type txProducer struct {
	t     testing.TB
	cl    *kgo.Client
	topic string
}

func newTxProducer(t testing.TB, brokers []string, topic string) *txProducer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(kafkatest.Name("tx")),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.TransactionTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &txProducer{t: t, cl: cl, topic: topic}
}

func (p *txProducer) begin() {
	p.t.Helper()
	if err := p.cl.BeginTransaction(); err != nil {
		p.t.Fatal(err)
	}
}

// produce writes records in the open transaction and waits for their acks,
// so that records of several producers interleave in the order of the calls.
func (p *txProducer) produce(records ...kafka.Message) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, m := range records {
		r := &kgo.Record{Topic: p.topic, Partition: 0, Key: m.Key, Value: m.Value}
		for _, h := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		if err := p.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			p.t.Fatal(err)
		}
	}
}

func (p *txProducer) end(commit bool) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		p.t.Fatal(err)
	}
}

// lastStable returns partition 0's last stable offset.
func lastStable(t testing.TB, brokers []string, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{IsolationLevel: kafka.ReadCommitted,
		Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatal(p.Error)
		}
		return p.LastOffset
	}
	t.Fatalf("no offsets for %s", topic)
	return 0
}

// settled waits until partition 0 of topic has no open transaction: a
// transaction's markers are written after EndTransaction returns.
func settled(t testing.TB, brokers []string, topic string) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, "the transaction markers of "+topic, func() bool {
		return lastStable(t, brokers, topic) == kafkatest.EndOffsetsOn(t, brokers, topic, 1)[0]
	})
}

// Transactional producers upstream: commits and aborts interleaved, two
// producers on one partition, an aborted record whose key is committed
// later with the same payload, a transaction left open, and a transaction
// marker at the partition's tail. Only committed records are applied, each
// once; nothing behind the open transaction is delivered until it ends;
// no marker reaches a handler (the dead-letter topic stays empty); and the
// committed offset reaches the end of the log.
func TestReadCommittedTransactions(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	w := newWorld(t, 1)
	a := newTxProducer(t, w.brokers, w.topic)
	b := newTxProducer(t, w.brokers, w.topic)
	exp, recs := commands(40)
	_, abortedRecs := commands(12) // never to be applied
	// Commits and aborts interleaved, two producers in flight at once.
	a.begin()
	b.begin()
	a.produce(recs[0], recs[1])
	b.produce(abortedRecs[0], abortedRecs[1])
	a.produce(recs[2])
	b.produce(abortedRecs[2])
	b.end(false)
	a.produce(recs[3])
	a.end(true)
	b.begin()
	a.begin()
	b.produce(recs[4], recs[5])
	a.produce(abortedRecs[3:6]...)
	b.produce(recs[6])
	a.end(false)
	b.end(true)
	w.produce(recs[7:10]...) // outside any transaction
	// An aborted record whose key is later committed with the same payload.
	a.begin()
	a.produce(recs[10])
	a.end(false)
	b.begin()
	b.produce(recs[10], recs[11])
	b.end(true)
	// Many transactions back to back (Kafka 4 bumps the producer epoch on
	// every one of them).
	for i := 12; i < 30; i += 3 {
		a.begin()
		a.produce(recs[i : i+3]...)
		if i%2 != 0 {
			a.produce(abortedRecs[6+(i-12)/3])
		}
		a.end(i%2 == 0)
	}
	// The odd rounds above aborted their committed-looking records too.
	for i := 12; i < 30; i += 3 {
		if i%2 != 0 {
			for _, r := range recs[i : i+3] {
				delete(exp, header(r, "_watermill_message_uuid"))
			}
		}
	}
	settled(t, w.brokers, w.topic)
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(without(exp, recs[30:]))

	// A transaction left open: nothing after it is delivered until it ends.
	c := newTxProducer(t, w.brokers, w.topic)
	c.begin()
	c.produce(recs[30], recs[31])
	w.produce(recs[32:35]...)
	b.begin()
	b.produce(recs[35:38]...)
	b.end(true)
	lso := lastStable(t, w.brokers, w.topic)
	testenv.WaitFor(t, time.Minute, "the group to reach the last stable offset "+strconv.FormatInt(lso, 10), func() bool {
		return kafkatest.CommittedOffsetsOn(t, w.brokers, group, w.topic, 1)[0] >= lso
	})
	if got := kafkatest.CommittedOffsetsOn(t, w.brokers, group, w.topic, 1)[0]; got != lso {
		t.Fatalf("committed offset %d is past the last stable offset %d", got, lso)
	}
	w.assertExactlyOnce(without(exp, recs[30:]))
	c.produce(recs[38])
	c.end(true) // the tail of the partition is now a commit marker
	settled(t, w.brokers, w.topic)
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(without(exp, recs[39:]))
	if dl := kafkatest.EndOffsetsOn(t, w.brokers, w.dlq, 1)[0]; dl != 0 {
		t.Fatalf("%d record(s) dead-lettered: a transaction marker or an aborted record reached the handler", dl)
	}
}

// without returns exp minus the commands of recs.
func without(exp map[string]command, recs []kafka.Message) map[string]command {
	out := make(map[string]command, len(exp))
	for u, c := range exp {
		out[u] = c
	}
	for _, r := range recs {
		delete(out, header(r, "_watermill_message_uuid"))
	}
	return out
}

// A transaction aborted at the tail of a partition: nothing of it is
// delivered, and the committed offset still moves past its records and its
// marker, so the group's lag reaches 0.
func TestAbortedTailIsCommittedPast(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	w := newWorld(t, 1)
	exp, recs := commands(5)
	_, aborted := commands(4)
	w.produce(recs...)
	p := newTxProducer(t, w.brokers, w.topic)
	p.begin()
	p.produce(aborted...)
	p.end(false)
	settled(t, w.brokers, w.topic)
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
}

// Without a group, under either isolation level: ReadUncommitted delivers
// the records of an aborted transaction, ReadCommitted does not, and
// neither delivers the transaction's marker.
func TestIsolationLevels(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 1)
	p := newTxProducer(t, brokers, topic)
	p.begin()
	p.produce(kafka.Message{Value: []byte("aborted-1")}, kafka.Message{Value: []byte("aborted-2")})
	p.end(false)
	p.begin()
	p.produce(kafka.Message{Value: []byte("committed")})
	p.end(true)
	settled(t, brokers, topic)
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer wr.Close()
	if err := wr.WriteMessages(context.Background(), kafka.Message{Value: []byte("last")}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		isolation kafkapubsub.Isolation
		want      string
	}{
		{kafkapubsub.ReadUncommitted, "aborted-1,aborted-2,committed,last"},
		{kafkapubsub.ReadCommitted, "committed,last"},
	} {
		sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, Isolation: tc.isolation, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range ch {
			got = append(got, string(m.Payload))
			m.Ack()
			if string(m.Payload) == "last" {
				break
			}
		}
		cancel()
		_ = sub.Close()
		if g := strings.Join(got, ","); g != tc.want {
			t.Errorf("isolation %d delivered %s, want %s", tc.isolation, g, tc.want)
		}
	}
}
