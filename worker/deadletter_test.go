package worker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/worker"
)

// A dead letter is the record as it arrived (its key, value and headers, in
// their order, a repeated header name included) plus the reason headers:
// a record with no message ID is dead-lettered with none, not with one the
// Publisher made up, in every mode, for an invalid key and for a handler's
// permanent error.
func TestDeadLetterIsTheRecordAsItArrived(t *testing.T) {
	for _, mode := range []string{"per-message", "keyed", "batch"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, 1)
			cfg := w.config(func(c *worker.Config) {
				// A payload "reject" is refused by the handler for good.
				c.Handler = func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
					if string(msg.Payload) == "reject" {
						return nil, dedupe.Permanent(errors.New("rejected"))
					}
					return w.handler(ctx, tx, msg)
				}
				switch mode {
				case "keyed":
					c.MaxInFlight, c.KeyOrdered = 8, true
				case "batch":
					h := c.Handler
					c.Handler, c.BatchSize = nil, 50
					c.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
						outs := make([][]*message.Message, len(msgs))
						for i, m := range msgs {
							o, err := h(ctx, tx, m)
							if err != nil {
								return nil, err
							}
							outs[i] = o
						}
						return outs, nil
					}
				}
			})
			_, stop := w.start(cfg)

			sent := []kafka.Message{
				// No message ID: an invalid key (MissingKey Reject).
				{Key: []byte("k-1"), Value: []byte("no id"), Headers: []kafka.Header{
					{Key: "trace", Value: []byte("a")}, {Key: "tag", Value: []byte("x")}, {Key: "tag", Value: []byte("y")}}},
				// No key at all, no message ID.
				{Value: []byte("no key"), Headers: []kafka.Header{{Key: "only", Value: []byte("1")}}},
				// A message ID, refused by the handler.
				{Key: []byte("k-3"), Value: []byte("reject"), Headers: []kafka.Header{
					{Key: kafkapubsub.UUIDHeader, Value: []byte("0190a0e8-0000-7000-8000-000000000003")},
					{Key: "tag", Value: []byte("x")}, {Key: "tag", Value: []byte("y")}}},
				// Applied.
				{Key: []byte("k-4"), Value: []byte("fine"), Headers: []kafka.Header{
					{Key: kafkapubsub.UUIDHeader, Value: []byte("0190a0e8-0000-7000-8000-000000000004")}}},
			}
			kw := &kafka.Writer{Addr: kafka.TCP(w.brokers...), Topic: w.commands, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
			defer kw.Close()
			if err := kw.WriteMessages(context.Background(), sent...); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, time.Minute, "the last record applied", func() bool {
				return w.count("SELECT count(*) FROM "+w.db.Table("applied")) == 1
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			letters := kafkatest.ReadAll(t, w.dlq, 1, time.Minute)
			if len(letters) != 3 {
				t.Fatalf("%d dead letters, want 3", len(letters))
			}
			for _, got := range letters {
				// Keyed mode dead-letters records of different keys in any
				// order: match each letter to its record by value.
				var want kafka.Message
				for _, s := range sent {
					if bytes.Equal(s.Value, got.Value) {
						want = s
					}
				}
				if want.Value == nil || string(want.Value) == "fine" {
					t.Errorf("dead letter %q: not one of the refused records", got.Value)
					continue
				}
				if !bytes.Equal(got.Key, want.Key) || (got.Key == nil) != (want.Key == nil) {
					t.Errorf("dead letter %q: key %q, want %q", want.Value, got.Key, want.Key)
				}
				var own, reasons []kafka.Header
				for _, h := range got.Headers {
					switch h.Key {
					case middleware.ReasonForPoisonedKey, middleware.PoisonedTopicKey, middleware.PoisonedHandlerKey, middleware.PoisonedSubscriberKey:
						reasons = append(reasons, h)
						continue
					}
					own = append(own, h)
				}
				if fmt.Sprint(headerText(own)) != fmt.Sprint(headerText(want.Headers)) {
					t.Errorf("dead letter %q: headers %v, want the record's %v plus the reasons", want.Value, headerText(own), headerText(want.Headers))
				}
				var reason string
				for _, h := range reasons {
					if h.Key == middleware.ReasonForPoisonedKey {
						reason = string(h.Value)
					}
				}
				if reason == "" {
					t.Errorf("dead letter %q: no %s header among %v", want.Value, middleware.ReasonForPoisonedKey, headerText(got.Headers))
				}
			}
		})
	}
}

func headerText(hs []kafka.Header) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Key + "=" + string(h.Value)
	}
	return out
}

// A batch handler's MessageError names the message's index in its batch;
// the message, once alone on the per-message path, is dead-lettered with
// the handler's own reason, not "message 0 of the batch" (a batch it is not
// in any more).
func TestDeadLetterReasonOfAMessageHandledAlone(t *testing.T) {
	w := newWorld(t, 1)
	cfg := w.config(func(c *worker.Config) {
		c.Handler, c.BatchSize = nil, 50
		c.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
			var bad []error
			for i, m := range msgs {
				if strings.HasPrefix(m.UUID, "bad") {
					bad = append(bad, &consumer.MessageError{Index: i, Err: dedupe.Permanent(errors.New("amount is not a number"))})
				}
			}
			if len(bad) > 0 {
				return nil, errors.Join(bad...)
			}
			return w.batchHandler(ctx, tx, msgs)
		}
	})
	_, stop := w.start(cfg)
	w.send("ok-1", "bad-1", "ok-2")
	testenv.WaitFor(t, time.Minute, "the good commands applied", func() bool {
		return w.count("SELECT count(*) FROM "+w.db.Table("applied")) == 2
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	letters := kafkatest.ReadAll(t, w.dlq, 1, time.Minute)
	if len(letters) == 0 {
		t.Fatal("no dead letter")
	}
	for _, l := range letters {
		var reason string
		for _, h := range l.Headers {
			if h.Key == middleware.ReasonForPoisonedKey {
				reason = string(h.Value)
			}
		}
		if !strings.Contains(reason, "amount is not a number") || strings.Contains(reason, "of the batch") {
			t.Errorf("dead letter %q: reason %q, want the handler's reason alone", l.Value, reason)
		}
	}
}
