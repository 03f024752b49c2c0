package kafkapubsub_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pubsubtest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// sized is the i-th record's key and value: null, empty, small, and values
// about and past the fetch arena's 16 KiB blocks.
func sized(tag string, i, kinds int) (key, value []byte) {
	switch i % kinds {
	case 0:
		key = nil
	case 1:
		key = []byte{}
	default:
		key = []byte(tag + "-k" + strconv.Itoa(i))
	}
	n := []int{-1, 0, 1, 100, 4097, 16 << 10, 40_000}[i%kinds]
	if i%11 == 3 {
		n = -1 // a tombstone among the others
	}
	if n < 0 {
		return key, nil
	}
	value = make([]byte, n)
	for j := range value {
		value[j] = byte(i + j*7)
	}
	if n > 0 {
		copy(value, tag+strconv.Itoa(i))
	}
	return key, value
}

// Records of mixed sizes, null and empty keys and values, in zstd and gzip
// batches, aborted and committed transactions among them, more than a
// fetch's chunk of them, come out byte for byte as the broker holds them
// (nil a nil, empty an empty), and stay so while handlers keep, change and
// append to the payloads of the ones acked before; a message's context is
// cancelled once it is acked.
func TestDeliveredBytesAsTheBrokerHolds(t *testing.T) {
	brokers := kafkatest.RealParallel(t)
	topic := kafkatest.Topic(t, 1)
	ctx := context.Background()
	type want struct{ key, value []byte }
	var wants []want
	produce := func(cl *kgo.Client, tag string, n, kinds int, keep bool) {
		t.Helper()
		rs := make([]*kgo.Record, n)
		for i := range rs {
			k, v := sized(tag, i, kinds)
			rs[i] = &kgo.Record{Key: k, Value: v}
			if keep {
				wants = append(wants, want{k, v})
			}
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for _, codec := range []kgo.CompressionCodec{kgo.ZstdCompression(), kgo.GzipCompression(), kgo.NoCompression()} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
			kgo.ProducerBatchCompression(codec), kgo.ProducerBatchMaxBytes(900<<10), kgo.ProducerLinger(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		produce(cl, "tiny", 1500, 4, true)
		produce(cl, "plain", 300, 7, true)
		cl.Close()
	}
	txc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(kafkatest.Name("tx")), kgo.DefaultProduceTopic(topic),
		kgo.ProducerBatchCompression(kgo.GzipCompression()), kgo.ProducerBatchMaxBytes(900<<10))
	if err != nil {
		t.Fatal(err)
	}
	for _, commit := range []kgo.TransactionEndTry{kgo.TryAbort, kgo.TryCommit, kgo.TryAbort, kgo.TryCommit} {
		if err := txc.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		produce(txc, fmt.Sprintf("txn%v", commit), 600, 5, bool(commit))
		if err := txc.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	txc.Close()

	_, sc := pubsubtest.Configs(brokers, kafkatest.Name("g"))
	sc.Isolation = kafkapubsub.ReadCommitted
	sub, err := kafkapubsub.NewSubscriber(&sc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		key, payload []byte
		ctx          context.Context
	}
	var gots []got
	deadline := time.After(2 * time.Minute)
	for len(gots) < len(wants) {
		select {
		case m := <-ch:
			i := len(gots)
			var key []byte
			if k, ok := m.Metadata[kafkapubsub.MetadataKafkaKey]; ok {
				key = []byte(k)
			}
			mctx := m.Context()
			child, cancel := context.WithTimeout(mctx, time.Hour)
			defer cancel()
			gots = append(gots, got{key, m.Payload, child})
			m.Ack()
			// A handler that keeps the payload past its ack, changes it in
			// place and appends to it.
			if i%3 == 0 && len(m.Payload) > 0 {
				for j := range m.Payload {
					m.Payload[j] ^= 0xff
				}
				wants[i].value = append([]byte(nil), wants[i].value...)
				for j := range wants[i].value {
					wants[i].value[j] ^= 0xff
				}
				_ = append(m.Payload, bytes.Repeat([]byte{'!'}, 64)...)
			}
		case <-deadline:
			t.Fatalf("%d of %d records in 2 minutes", len(gots), len(wants))
		}
	}
	for i, g := range gots {
		w := wants[i]
		if (g.payload == nil) != (w.value == nil) || !bytes.Equal(g.payload, w.value) {
			t.Fatalf("record %d: payload %d bytes (nil %v), want %d bytes (nil %v)", i, len(g.payload), g.payload == nil, len(w.value), w.value == nil)
		}
		if (g.key == nil) != (w.key == nil) || !bytes.Equal(g.key, w.key) {
			t.Fatalf("record %d: key %q, want %q", i, g.key, w.key)
		}
	}
	for i, g := range gots {
		select {
		case <-g.ctx.Done():
		case <-time.After(time.Minute):
			t.Fatalf("record %d: a context derived from an acked message's not done in a minute", i)
		}
		if !errors.Is(g.ctx.Err(), context.Canceled) || !errors.Is(context.Cause(g.ctx), context.Canceled) {
			t.Fatalf("record %d: derived context Err %v Cause %v, want context.Canceled", i, g.ctx.Err(), context.Cause(g.ctx))
		}
	}
}
