package kafkapubsub

import (
	"crypto/tls"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/sasl"

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
	return false
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

// toWatermill converts a fetched record into a Watermill message.
func toWatermill(km kafka.Message) *message.Message {
	var uuid string
	md := make(message.Metadata, len(km.Headers)+5)
	for _, h := range km.Headers {
		if h.Key == UUIDHeader {
			uuid = string(h.Value)
			continue
		}
		md[h.Key] = string(h.Value)
	}
	msg := message.NewMessage(uuid, km.Value)
	md[MetadataTopic] = km.Topic
	md[MetadataPartition] = strconv.Itoa(km.Partition)
	md[MetadataOffset] = strconv.FormatInt(km.Offset, 10)
	if km.Key != nil {
		md[MetadataKafkaKey] = string(km.Key)
	}
	if !km.Time.IsZero() {
		md[MetadataTimestamp] = km.Time.UTC().Format(time.RFC3339Nano)
	}
	msg.Metadata = md
	return msg
}

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
