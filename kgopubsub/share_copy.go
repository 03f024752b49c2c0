package kgopubsub

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/internal/mdkeys"
)

// copyFrom is the delivery from which a record is copied before it is
// handed out, for a group whose delivery limit is limit: its last two
// deliveries (but never its first), so that a record is archived only if
// the members holding both of them die before copying it.
func copyFrom(limit int32) int32 { return max(2, limit-1) }

// copyTimeout bounds the copy of a record near its last delivery.
const copyTimeout = 30 * time.Second

// copyAhead copies r, whose origin is from, unchanged but for its count of
// deliveries and its origin, to the
// end of its partition, before one of its last deliveries: the broker
// archives a record whose last delivery fails (a crash, a lock that runs
// out, a release), and the copy carries the command on. A process killed
// between the fetch and the copy (a produce's round trip) leaves the
// record to its next delivery, which copies it if there is one. It tries
// for up to copyTimeout, even past r's lock (the copy matters, not the
// delivery) and after Close. It says whether the copy was made.
func (sub *shareSub) copyAhead(r *kgo.Record, deliveries int, from string) bool {
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+2)
	for _, h := range r.Headers {
		if !mdkeys.ShareHeader(h.Key) {
			headers = append(headers, h)
		}
	}
	headers = append(headers,
		kgo.RecordHeader{Key: mdkeys.ShareDeliveries, Value: []byte(strconv.Itoa(deliveries))},
		kgo.RecordHeader{Key: mdkeys.ShareOrigin, Value: []byte(from)})
	// The copy gets the time of its append: a topic whose brokers refuse
	// old timestamps would refuse the record's own.
	cp := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: headers}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), copyTimeout)
	defer cancel()
	start := time.Now()
	produce := func() error { return sub.cl.ProduceSync(ctx, cp).FirstErr() }
	if recordBytes(cp) > int(sub.maxBytes) {
		// Over the topic's limit uncompressed, as franz-go checks it: a
		// record its producer compressed below it. Copied compressed,
		// through a client of its own whose batches the broker alone
		// bounds (it checks them compressed).
		produce = func() error { return sub.copyCompressed(ctx, cp) }
	}
	for {
		err := produce()
		if err == nil {
			sub.s.cfg.Logger.Info("kgopubsub: a record near its last delivery was copied to the end of its partition", "group", sub.s.cfg.ConsumerGroup,
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "delivery", r.DeliveryCount(), "took", time.Since(start))
			return true
		}
		if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
			// No retry makes it smaller.
			sub.s.cfg.Logger.Error("kgopubsub: MESSAGE_TOO_LARGE: a record near its last delivery could not be copied, its copy is over the topic's max.message.bytes "+
				"(compressed with zstd when larger uncompressed): if its last delivery fails too, the broker archives it; raise the topic's max.message.bytes",
				"group", sub.s.cfg.ConsumerGroup, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
				"value_bytes", len(r.Value), "max_message_bytes", sub.maxBytes, "err", err)
			return false
		}
		if ctx.Err() != nil {
			hint := ""
			if errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) {
				hint = " (the role needs the Write right on the topic)"
			}
			sub.s.cfg.Logger.Error("kgopubsub: a record near its last delivery could not be copied"+hint+": if its last delivery fails too, the broker archives it",
				"group", sub.s.cfg.ConsumerGroup, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
			return false
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// recordBytes is about how many bytes franz-go counts r for, uncompressed.
func recordBytes(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + 64
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}

// compressedCopyMax bounds a compressed copy's batch, uncompressed: the
// broker checks it, compressed, against the topic's max.message.bytes.
const compressedCopyMax = 64 << 20

// copyCompressed produces cp compressed with zstd, through a client of its
// own (an idempotent producer too) whose batches may be as large as
// compressedCopyMax uncompressed.
func (sub *shareSub) copyCompressed(ctx context.Context, cp *kgo.Record) error {
	opts := append(SecurityOptions(sub.s.cfg.Security), kgo.SeedBrokers(sub.s.cfg.Brokers...), kgo.WithLogger(kgoLogger{sub.s.cfg.Logger}),
		kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.ZstdCompression()),
		kgo.ProducerBatchMaxBytes(compressedCopyMax), kgo.BrokerMaxWriteBytes(compressedCopyMax+1<<20),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, cp).FirstErr()
}

// defaultMaxMessageBytes is Kafka's default max.message.bytes.
const defaultMaxMessageBytes = 1048588

// topicMaxBytes returns topic's max.message.bytes (bounded by what the
// client writes to a broker at most), or Kafka's default when it cannot be
// read (logged).
func topicMaxBytes(ctx context.Context, cl *kgo.Client, topic string, log *slog.Logger) int32 {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	res.ConfigNames = []string{"max.message.bytes"}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) != 1 {
		err = errors.New("no answer for the topic")
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	n := int64(-1)
	if err == nil {
		for _, c := range resp.Resources[0].Configs {
			if c.Name == "max.message.bytes" && c.Value != nil {
				n, err = strconv.ParseInt(*c.Value, 10, 32)
			}
		}
	}
	if err != nil || n < 1 {
		log.Warn("kgopubsub: could not read the topic's max.message.bytes (the role needs the DescribeConfigs right on the topic): "+
			"records near their last delivery are copied in batches of up to Kafka's default", "topic", topic, "default", defaultMaxMessageBytes, "err", err)
		return defaultMaxMessageBytes
	}
	if limit, ok := cl.OptValue(kgo.BrokerMaxWriteBytes).(int32); ok && int64(limit) < n {
		n = int64(limit)
	}
	return int32(max(n, 512))
}

// originOffset is the offset of the record r copies, or r's own: a header
// that names another topic or partition, or no earlier offset, is not a
// copy's (a record copied from another topic as it was, say).
func originOffset(r *kgo.Record) int64 {
	for _, h := range r.Headers {
		if h.Key != mdkeys.ShareOrigin {
			continue
		}
		parts := strings.Split(string(h.Value), "/")
		if len(parts) != 3 || parts[0] != r.Topic || parts[1] != strconv.Itoa(int(r.Partition)) {
			return r.Offset
		}
		if o, err := strconv.ParseInt(parts[2], 10, 64); err == nil && o >= 0 && o < r.Offset {
			return o
		}
	}
	return r.Offset
}

// originAt names the record at offset of r's partition.
func originAt(r *kgo.Record, offset int64) string {
	return r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(offset, 10)
}

// priorDeliveries is how many times the records r copies were delivered.
func priorDeliveries(r *kgo.Record) int {
	for _, h := range r.Headers {
		if h.Key == mdkeys.ShareDeliveries {
			n, _ := strconv.Atoi(string(h.Value))
			return max(n, 0)
		}
	}
	return 0
}
