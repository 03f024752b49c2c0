package console

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// The page lists a letter's headers and never its value: the letters it
// builds hold no record value.
func TestListedLettersHoldNoValue(t *testing.T) {
	kafkatest.RequireReal(t)
	db := pgtest.New(t)
	brokers := kafkatest.Brokers(t)
	dlq := kafkatest.Topic(t, 1)
	kw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: dlq, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer kw.Close()
	if err := kw.WriteMessages(context.Background(), kafka.Message{Key: []byte("k"), Value: bytes.Repeat([]byte("x"), 512<<10)}); err != nil {
		t.Fatal(err)
	}
	c, err := New(db.Pool, &Config{Brokers: brokers, DeadLetterTopic: dlq, Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := c.letters(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("letters: %d, %v", len(list), err)
	}
	if n := len(list[0].Record.Value) + len(list[0].Record.Headers); n != 0 {
		t.Errorf("a listed letter keeps its record (%d bytes of value, %d headers)", len(list[0].Record.Value), len(list[0].Record.Headers))
	}
}
