package eotel_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/plugin/eotel"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type world struct {
	rec   *tracetest.SpanRecorder
	tp    *sdktrace.TracerProvider
	tr    *eotel.Tracer
	db    *pgtest.DB
	store *pgstore.Store
}

func newWorld(t *testing.T) *world {
	w := &world{rec: tracetest.NewSpanRecorder(), db: pgtest.New(t)}
	w.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(w.rec))
	w.tr = eotel.New(&eotel.Config{TracerProvider: w.tp})
	if _, err := w.db.Pool.Exec(context.Background(), "CREATE TABLE "+w.db.Table("applied")+" (uuid text)"); err != nil {
		t.Fatal(err)
	}
	var err error
	if w.store, err = pgstore.New(w.db.Pool, &pgstore.Config{Schema: w.db.Schema}); err != nil {
		t.Fatal(err)
	}
	return w
}

// handler records each message it applies, and returns outs(msg).
func (w *world) handler(outs func(*message.Message) []*message.Message) message.HandlerFunc {
	return consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO "+w.db.Table("applied")+" VALUES ($1)", msg.UUID); err != nil {
			return nil, err
		}
		if outs == nil {
			return nil, nil
		}
		return outs(msg), nil
	})
}

func (w *world) applied(t *testing.T) int {
	var n int
	if err := w.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+w.db.Table("applied")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// consume delivers n messages of topic to h, acking each; it fails t when
// they do not arrive within a minute.
func consume(t *testing.T, brokers []string, topic string, n int, h message.HandlerFunc) {
	t.Helper()
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: kafkatest.Name("g"), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		select {
		case msg := <-ch:
			if _, err := h(msg); err != nil {
				t.Fatalf("message %s: %v", msg.UUID, err)
			}
			msg.Ack()
		case <-ctx.Done():
			t.Fatalf("%d of %d messages of %s arrived", i, n, topic)
		}
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func spans(rec *tracetest.SpanRecorder, kind trace.SpanKind, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == kind && s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// A message published through the traced Publisher to a real broker is
// consumed in a span that is the child of its producer span: the W3C
// traceparent travels as a Kafka header. The consumer span carries the
// scope, key, outcome, topic, partition and offset.
func TestKafkaRoundTrip(t *testing.T) {
	w := newWorld(t)
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 2)
	kpub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	pub := w.tr.Publisher(kpub)
	defer pub.Close()

	ctx, root := w.tp.Tracer("test").Start(context.Background(), "request")
	id := watermill.NewUUID()
	for range 2 { // the same command twice: applied, then a duplicate
		msg := message.NewMessage(id, []byte(`{"amount":10}`))
		msg.Metadata.Set(kafkapubsub.MetadataKafkaKey, "acc-1")
		msg.SetContext(ctx)
		if err := pub.Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	root.End()

	dedup, err := consumer.NewMiddleware(w.store, &consumer.Config{Scope: "eotel", Hooks: w.tr, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	consume(t, brokers, topic, 2, w.tr.Middleware(dedup.Middleware(w.handler(nil))))
	if n := w.applied(t); n != 1 {
		t.Fatalf("applied %d times, want once", n)
	}

	producers := spans(w.rec, trace.SpanKindProducer, "send "+topic)
	consumers := spans(w.rec, trace.SpanKindConsumer, "process "+topic)
	if len(producers) != 2 || len(consumers) != 2 {
		t.Fatalf("%d producer and %d consumer spans, want 2 and 2", len(producers), len(consumers))
	}
	parents := map[trace.SpanID]bool{}
	for _, p := range producers {
		if p.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("producer span's parent is %s, want the request span %s", p.Parent().SpanID(), root.SpanContext().SpanID())
		}
		parents[p.SpanContext().SpanID()] = true
	}
	outcomes := map[string]bool{}
	for _, c := range consumers {
		if c.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("consumer span in trace %s, want %s", c.SpanContext().TraceID(), root.SpanContext().TraceID())
		}
		if !c.Parent().IsRemote() || !parents[c.Parent().SpanID()] {
			t.Errorf("consumer span's parent %s (remote %v) is not a producer span", c.Parent().SpanID(), c.Parent().IsRemote())
		}
		delete(parents, c.Parent().SpanID())
		a := attrs(c)
		outcomes[a[eotel.AttrOutcome].AsString()] = true
		for k, want := range map[attribute.Key]string{eotel.AttrScope: "eotel", eotel.AttrKey: id,
			eotel.AttrTopic: topic, eotel.AttrKafkaKey: "acc-1", eotel.AttrSystem: "kafka"} {
			if got := a[k].AsString(); got != want {
				t.Errorf("consumer span: %s = %q, want %q", k, got, want)
			}
		}
		if _, ok := a[eotel.AttrPartition]; !ok {
			t.Errorf("consumer span has no %s", eotel.AttrPartition)
		}
		if _, ok := a[eotel.AttrOffset]; !ok {
			t.Errorf("consumer span has no %s", eotel.AttrOffset)
		}
		if c.Status().Code == codes.Error {
			t.Errorf("consumer span of outcome %s has an error status", a[eotel.AttrOutcome].AsString())
		}
	}
	if !outcomes["applied"] || !outcomes["duplicate"] {
		t.Errorf("outcomes %v, want applied and duplicate", outcomes)
	}
}

// A handler's outputs written to the outbox carry its span's context in
// their stored metadata; the relay's producer span is its child, and the
// consumer of the published message is a child of that.
func TestThroughOutbox(t *testing.T) {
	w := newWorld(t)
	brokers := kafkatest.Brokers(t)
	out := kafkatest.Topic(t, 1)
	ow, err := outbox.NewWriter(&outbox.Config{Schema: w.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	dedup, err := consumer.NewMiddleware(w.store, &consumer.Config{Scope: "eotel", Hooks: w.tr,
		Outputs: w.tr.Outputs(ow.Outputs(out)), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	// An incoming command whose producer was traced.
	ctx, root := w.tp.Tracer("test").Start(context.Background(), "request")
	in := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":10}`))
	w.tr.Inject(ctx, in)
	root.End()
	h := w.tr.Middleware(dedup.Middleware(w.handler(func(msg *message.Message) []*message.Message {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"applied":"`+msg.UUID+`"}`))}
	})))
	if _, err := h(in); err != nil {
		t.Fatal(err)
	}

	kpub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	pub := w.tr.Publisher(kpub)
	defer pub.Close()
	relay, err := outbox.NewRelay(w.db.Pool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: w.db.Schema}, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("the relay published %d message(s) (%v), want 1", n, err)
	}
	consume(t, brokers, out, 1, w.tr.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil }))

	handled := spans(w.rec, trace.SpanKindConsumer, "process")
	sent := spans(w.rec, trace.SpanKindProducer, "send "+out)
	received := spans(w.rec, trace.SpanKindConsumer, "process "+out)
	if len(handled) != 1 || len(sent) != 1 || len(received) != 1 {
		t.Fatalf("spans: %d handled, %d sent, %d received; want 1 each", len(handled), len(sent), len(received))
	}
	for _, link := range []struct {
		what          string
		child, parent trace.SpanContext
	}{
		{"the handler's span", handled[0].Parent(), root.SpanContext()},
		{"the relay's producer span", sent[0].Parent(), handled[0].SpanContext()},
		{"the consumer span of the published message", received[0].Parent(), sent[0].SpanContext()},
	} {
		if link.child.TraceID() != link.parent.TraceID() || link.child.SpanID() != link.parent.SpanID() {
			t.Errorf("%s has parent %s/%s, want %s/%s", link.what, link.child.TraceID(), link.child.SpanID(),
				link.parent.TraceID(), link.parent.SpanID())
		}
	}
	if got := attrs(handled[0])[eotel.AttrOutcome].AsString(); got != "applied" {
		t.Errorf("handler span outcome %q, want applied", got)
	}
}

// A failed delivery ends its span with an error status and the outcome; the
// hooks alone (no Middleware) still record a span per message.
func TestFailureStatus(t *testing.T) {
	for _, withMiddleware := range []bool{true, false} {
		w := newWorld(t)
		dedup, err := consumer.NewMiddleware(w.store, &consumer.Config{Scope: "eotel", Hooks: w.tr, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		h := dedup.Middleware(w.handler(nil))
		if withMiddleware {
			h = w.tr.Middleware(h)
		}
		id := watermill.NewUUID()
		if _, err := h(message.NewMessage(id, []byte(`{"amount":10}`))); err != nil {
			t.Fatal(err)
		}
		if _, err := h(message.NewMessage(id, []byte(`{"amount":99}`))); err == nil {
			t.Fatal("a key reused with another payload was accepted")
		}
		got := spans(w.rec, trace.SpanKindConsumer, "process")
		if len(got) != 2 {
			t.Fatalf("middleware %v: %d spans, want 2", withMiddleware, len(got))
		}
		for i, want := range []struct {
			outcome string
			code    codes.Code
		}{{"applied", codes.Unset}, {"key_reused", codes.Error}} {
			if o := attrs(got[i])[eotel.AttrOutcome].AsString(); o != want.outcome || got[i].Status().Code != want.code {
				t.Errorf("middleware %v: span %d: outcome %q status %v, want %q %v", withMiddleware, i, o,
					got[i].Status().Code, want.outcome, want.code)
			}
		}
	}
}

// In batch mode each message's span joins its producer's trace: the hook
// gets the message's context, where Tracer.Subscriber put the trace context
// of its metadata.
func TestBatchJoinsProducerTrace(t *testing.T) {
	w := newWorld(t)
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 1)
	kpub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	pub := w.tr.Publisher(kpub)
	defer pub.Close()
	roots := map[trace.TraceID]bool{}
	const n = 4
	for i := range n { // one request, so one trace, per message
		ctx, root := w.tp.Tracer("test").Start(context.Background(), "request")
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"n":`+strconv.Itoa(i)+`}`))
		msg.SetContext(ctx)
		if err := pub.Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
		root.End()
		roots[root.SpanContext().TraceID()] = true
	}
	var batches atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		batches.Add(1)
		for _, m := range msgs {
			if _, err := tx.Exec(ctx, "INSERT INTO "+w.db.Table("applied")+" VALUES ($1)", m.UUID); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	bc, err := consumer.NewBatchConsumer(w.store, h, &consumer.BatchConfig{
		Config:  consumer.Config{Scope: "eotel", Hooks: w.tr, Logger: quiet()},
		MaxSize: n,
		MaxWait: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: kafkatest.Name("g"),
		MaxInFlight: n, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bc.Subscribe(ctx, w.tr.Subscriber(sub), topic) }()
	testenv.WaitFor(t, time.Minute, "a consumer span per message", func() bool {
		return len(spans(w.rec, trace.SpanKindConsumer, "process "+topic)) >= n
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if a := w.applied(t); a != n || batches.Load() >= n {
		t.Fatalf("%d applied in %d batches, want %d in fewer batches", a, batches.Load(), n)
	}
	parents := map[trace.SpanID]bool{}
	for _, p := range spans(w.rec, trace.SpanKindProducer, "send "+topic) {
		parents[p.SpanContext().SpanID()] = true
	}
	for _, c := range spans(w.rec, trace.SpanKindConsumer, "process "+topic) {
		if !roots[c.SpanContext().TraceID()] {
			t.Errorf("consumer span in trace %s, not one of its producers'", c.SpanContext().TraceID())
		}
		delete(roots, c.SpanContext().TraceID())
		if !c.Parent().IsRemote() || !parents[c.Parent().SpanID()] {
			t.Errorf("consumer span's parent %s (remote %v) is not a producer span", c.Parent().SpanID(), c.Parent().IsRemote())
		}
		if got := attrs(c)[eotel.AttrOutcome].AsString(); got != "applied" {
			t.Errorf("consumer span's outcome %q, want applied", got)
		}
	}
}
