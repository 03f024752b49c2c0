package kafkapubsub

import (
	"context"
	"crypto/tls"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/exactly-go/exactly/internal/delivery"
	"github.com/exactly-go/exactly/internal/mdkeys"
)

// UUIDHeader carries the Watermill message UUID, as watermill-kafka does,
// so the two interoperate.
const UUIDHeader = "_watermill_message_uuid"

// Metadata keys that the Subscriber sets on every message it delivers.
// The Publisher never writes them as headers; it uses MetadataKafkaKey as the
// record key when no PartitionKeyFunc is set.
const (
	MetadataTopic     = "kafka_topic"
	MetadataPartition = "kafka_partition"
	MetadataOffset    = "kafka_offset"
	MetadataKafkaKey  = mdkeys.KafkaKey
	MetadataTimestamp = "kafka_timestamp" // RFC 3339 with nanoseconds
)

func reserved(k string) bool {
	switch k {
	case UUIDHeader, MetadataTopic, MetadataPartition, MetadataOffset, MetadataKafkaKey, MetadataTimestamp:
		return true
	}
	return mdkeys.ShareHeader(k)
}

// Security holds the connection's TLS and SASL settings, shared by the
// Subscriber and the Publisher.
type Security struct {
	// TLS enables TLS when set. Defaults to plain TCP.
	TLS *tls.Config
	// SASL authenticates with this mechanism when set (see kafka-go's
	// sasl/plain and sasl/scram packages). Defaults to none.
	SASL sasl.Mechanism
}

// Dialer returns a kafka-go Dialer with these settings, for tools that talk
// to Kafka through kafka-go directly.
func (s Security) Dialer(timeout time.Duration) *kafka.Dialer {
	return &kafka.Dialer{Timeout: timeout, DualStack: true, TLS: s.TLS, SASLMechanism: s.SASL}
}

// Transport returns a kafka-go Transport with these settings.
func (s Security) Transport() *kafka.Transport {
	return &kafka.Transport{TLS: s.TLS, SASL: s.SASL}
}

func (s Security) dialer(timeout time.Duration) *kafka.Dialer { return s.Dialer(timeout) }
func (s Security) transport() *kafka.Transport                { return s.Transport() }

// toWatermill converts a fetched record into a Watermill message. The
// metadata's values and the UUID are cut from one string, one allocation
// for them all; partition is the record's partition formatted (the same
// for all of a partition's records), stamps formats its timestamp (nil:
// each time).
func toWatermill(km *kafka.Message, partition string, stamps *delivery.Stamps) *message.Message {
	var stack [256]byte
	b := stack[:0]
	for _, h := range km.Headers {
		b = append(b, h.Value...)
	}
	hdrEnd := len(b)
	b = strconv.AppendInt(b, km.Offset, 10)
	offEnd := len(b)
	b = append(b, km.Key...)
	all := string(b)

	var uuid string
	at := 0
	for _, h := range km.Headers {
		if h.Key == UUIDHeader {
			uuid = all[at : at+len(h.Value)]
		}
		at += len(h.Value)
	}
	msg := message.NewMessage(uuid, km.Value)
	md := msg.Metadata
	at = 0
	for _, h := range km.Headers {
		if h.Key != UUIDHeader && !mdkeys.ShareHeader(h.Key) {
			md[h.Key] = all[at : at+len(h.Value)]
		}
		at += len(h.Value)
	}
	md[MetadataTopic] = km.Topic
	md[MetadataPartition] = partition
	md[MetadataOffset] = all[hdrEnd:offEnd]
	if km.Key != nil {
		md[MetadataKafkaKey] = all[offEnd:]
	}
	if !km.Time.IsZero() {
		md[MetadataTimestamp] = stamps.Format(km.Time)
	}
	return msg
}

// withArrived returns ctx carrying km, the record msg was made of.
func withArrived(ctx context.Context, km *kafka.Message) context.Context {
	return delivery.WithArrived(ctx, km)
}

// arrived returns the record msg was made of when msg is a message the
// Subscriber delivered, published again under the ID it arrived with (a
// dead letter, a message forwarded as it is), and nil otherwise.
func arrived(msg *message.Message) *kafka.Message { return delivery.Arrived(msg, arrivedUUID) }

// arrivedUUID is the message ID a record arrived with ("" for none), as
// toWatermill reads it.
func arrivedUUID(km *kafka.Message) string { return delivery.Last(km.Headers, UUIDHeader) }

// toKafka converts a Watermill message into a record for topic.
func toKafka(topic string, msg *message.Message, key []byte) kafka.Message {
	headers := make([]protocol.Header, 0, len(msg.Metadata)+1)
	headers = append(headers, protocol.Header{Key: UUIDHeader, Value: []byte(msg.UUID)})
	for k, v := range msg.Metadata {
		if reserved(k) {
			continue
		}
		headers = append(headers, protocol.Header{Key: k, Value: []byte(v)})
	}
	return kafka.Message{Topic: topic, Key: key, Value: msg.Payload, Headers: headers}
}

// toKafkaAsArrived converts msg, a message the Subscriber delivered as km,
// into a record for topic that is km as it arrived (its headers in their
// order, a repeated name included, and its message ID header only if it
// had one) with msg's changes: a header whose metadata the handler changed
// or deleted is left out, and metadata the record did not carry (a dead
// letter's reasons) follows it, sorted by name. The key is the record's own
// (nil stays nil) unless key differs from it.
func toKafkaAsArrived(topic string, msg *message.Message, km *kafka.Message, key []byte) kafka.Message {
	headers := delivery.AsArrived(km.Headers, msg.Metadata, UUIDHeader, reserved)
	if string(key) == string(km.Key) {
		key = km.Key
	}
	return kafka.Message{Topic: topic, Key: key, Value: msg.Payload, Headers: headers}
}
