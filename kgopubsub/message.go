package kgopubsub

import (
	"context"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/delivery"
	"github.com/exactly-go/exactly/internal/mdkeys"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// reserved says whether k is a metadata key the Subscriber sets, or a
// share copy's header, which the Publisher never writes as a header.
func reserved(k string) bool {
	switch k {
	case kafkapubsub.UUIDHeader, kafkapubsub.MetadataTopic, kafkapubsub.MetadataPartition, kafkapubsub.MetadataOffset,
		kafkapubsub.MetadataKafkaKey, kafkapubsub.MetadataTimestamp, MetadataDeliveryCount:
		return true
	}
	return mdkeys.ShareHeader(k)
}

// toWatermill converts a fetched record into a Watermill message, with the
// metadata kafkapubsub's Subscriber sets. The metadata's values and the
// UUID are cut from one string, one allocation for them all; partition is
// the record's partition formatted (the same for all of a partition's
// records), stamps formats its timestamp (nil: each time).
func toWatermill(r *kgo.Record, partition string, stamps *delivery.Stamps) *message.Message {
	var stack [256]byte
	b := stack[:0]
	for _, h := range r.Headers {
		b = append(b, h.Value...)
	}
	hdrEnd := len(b)
	b = strconv.AppendInt(b, r.Offset, 10)
	offEnd := len(b)
	b = append(b, r.Key...)
	all := string(b)

	var uuid string
	at := 0
	for _, h := range r.Headers {
		if h.Key == kafkapubsub.UUIDHeader {
			uuid = all[at : at+len(h.Value)]
		}
		at += len(h.Value)
	}
	msg := message.NewMessage(uuid, r.Value)
	md := msg.Metadata
	at = 0
	for _, h := range r.Headers {
		if h.Key != kafkapubsub.UUIDHeader && !mdkeys.ShareHeader(h.Key) {
			md[h.Key] = all[at : at+len(h.Value)]
		}
		at += len(h.Value)
	}
	md[kafkapubsub.MetadataTopic] = r.Topic
	md[kafkapubsub.MetadataPartition] = partition
	md[kafkapubsub.MetadataOffset] = all[hdrEnd:offEnd]
	if r.Key != nil {
		md[kafkapubsub.MetadataKafkaKey] = all[offEnd:]
	}
	if !r.Timestamp.IsZero() {
		md[kafkapubsub.MetadataTimestamp] = stamps.Format(r.Timestamp)
	}
	return msg
}

// withArrived returns ctx carrying r, the record a message was made of,
// as delivery.Partition[*kgo.Record] carries it: under *kgo.Record.
func withArrived(ctx context.Context, r *kgo.Record) context.Context {
	return delivery.WithArrived(ctx, &r)
}

// arrived returns the record msg was made of when msg is a message the
// Subscriber delivered, published again under the ID it arrived with (a
// dead letter, a message forwarded as it is), and nil otherwise.
func arrived(msg *message.Message) *kgo.Record {
	if r := delivery.Arrived(msg, arrivedUUID); r != nil {
		return *r
	}
	return nil
}

func arrivedUUID(r **kgo.Record) string { return delivery.Last((*r).Headers, kafkapubsub.UUIDHeader) }

// toRecord converts a Watermill message into a record for topic.
func toRecord(topic string, msg *message.Message, key []byte) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, len(msg.Metadata)+1)
	headers = append(headers, kgo.RecordHeader{Key: kafkapubsub.UUIDHeader, Value: []byte(msg.UUID)})
	for k, v := range msg.Metadata {
		if reserved(k) {
			continue
		}
		headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	return &kgo.Record{Topic: topic, Key: key, Value: msg.Payload, Headers: headers}
}

// toRecordAsArrived converts msg, a message the Subscriber delivered as r,
// into a record for topic that is r as it arrived (its headers in their
// order, a repeated name included, and its message ID header only if it
// had one) with msg's changes, as kafkapubsub's Publisher does.
func toRecordAsArrived(topic string, msg *message.Message, r *kgo.Record, key []byte) *kgo.Record {
	headers := delivery.AsArrived(r.Headers, msg.Metadata, kafkapubsub.UUIDHeader, reserved)
	if string(key) == string(r.Key) {
		key = r.Key
	}
	return &kgo.Record{Topic: topic, Key: key, Value: msg.Payload, Headers: headers}
}

// MetadataDeliveryCount is the metadata key of the delivery count of a
// message a ShareSubscriber delivers: 1 the first time the share group
// hands the record out, more after its lock timed out or it was released,
// its copies' deliveries included (the message's context carries it too,
// dedupe.DeliveriesFromContext: the consumer then counts the failures of
// a record and its copies together towards MaxAttempts).
const MetadataDeliveryCount = "kafka_delivery_count"
