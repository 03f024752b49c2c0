package kgopubsub

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/delivery"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// A message a partition delivers carries its coordinates and the record
// it was made of (which the Publisher writes again as it arrived), and
// its context is cancelled once it is acked.
func TestDeliveredMessageContext(t *testing.T) {
	p := newPartition(nil, "t", 2, 1<<30)
	r := &kgo.Record{Topic: "t", Partition: 2, Offset: 5, Key: []byte("k"), Value: []byte("v"), Timestamp: time.UnixMilli(1700000000123),
		Headers: []kgo.RecordHeader{{Key: kafkapubsub.UUIDHeader, Value: []byte("u1")}, {Key: "a", Value: []byte("1")}}}
	p.push([]*kgo.Record{r})
	out := make(chan *message.Message)
	stop, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); <-p.done }()
	cfg := delivery.Config{MaxInFlight: 1, NackBackoff: time.Millisecond, MaxNackBackoff: time.Millisecond, DrainTimeout: time.Second,
		Logger: slog.New(slog.DiscardHandler), Name: "kgopubsub"}
	go consume(cfg, context.Background(), stop, p, out, func(int64) {})
	var msg *message.Message
	select {
	case msg = <-out:
	case <-time.After(time.Minute):
		t.Fatal("no message within a minute")
	}
	if msg.UUID != "u1" || msg.Metadata.Get("a") != "1" || msg.Metadata.Get(kafkapubsub.MetadataPartition) != "2" ||
		msg.Metadata.Get(kafkapubsub.MetadataOffset) != "5" || msg.Metadata.Get(kafkapubsub.MetadataKafkaKey) != "k" ||
		msg.Metadata.Get(kafkapubsub.MetadataTimestamp) != "2023-11-14T22:13:20.123Z" {
		t.Fatalf("message %s metadata %v", msg.UUID, msg.Metadata)
	}
	if got := arrived(msg); got != r {
		t.Fatalf("arrived %v, want the record the message was made of", got)
	}
	if src, ok := dedupe.SourceFromContext(msg.Context()); !ok || src != (dedupe.Source{Topic: "t", Partition: 2, Offset: 5}) {
		t.Fatalf("source %+v %v", src, ok)
	}
	ctx := msg.Context()
	msg.Ack()
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the message's context not cancelled within a minute of its ack")
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("Err %v, want context.Canceled", ctx.Err())
	}
}
