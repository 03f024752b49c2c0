// Package eotel traces messages with OpenTelemetry: a span per message
// handled (with the middleware's scope, key and outcome, and the message's
// topic, partition and offset), and the trace context carried from producer
// to consumer in the messages' metadata, which the Kafka Publisher writes as
// record headers and the Subscriber reads back. It is a module of its own,
// so that importers of the core packages never compile OpenTelemetry.
//
//	tr := eotel.New(nil) // the global TracerProvider, W3C traceparent
//	pub = tr.Publisher(pub) // a producer span per message; traceparent in its metadata
//	dedup, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger",
//		Hooks:   tr,                             // the outcome on the message's span
//		Outputs: tr.Outputs(w.Outputs("events")), // outputs to the outbox carry the span
//	})
//	router.AddMiddleware(poison, retry, tr.Middleware, timeout, dedup.Middleware, middleware.Recoverer)
//	relay, err := outbox.NewRelay(pool, tr.Publisher(pub), nil)
//
// [Tracer.Middleware] starts a consumer span per delivery, child of the
// producer's span found in the message's metadata; place it outside the
// dedupe middleware (anywhere before it in AddMiddleware), so the span
// covers the claim, the handler and the commit, and its context reaches the
// handler and the [Tracer.OnMessage] hook, which sets the outcome. A failed
// delivery (any error returned to the router) ends with an error status.
//
// With a worker.Worker the Tracer is one plugin (worker.Config.Plugins),
// installed where each of its parts belongs, in per-message and batch mode:
//
//	w, err := worker.New(pool, &worker.Config{…, Plugins: []worker.Plugin{eotel.New(nil)}})
//
// Batch mode (consumer.BatchConsumer) runs no per-message middleware on its
// batch path: subscribe through [Tracer.Subscriber], which starts each
// delivery's consumer span, child of its producer's span, in the message's
// context, and set the Tracer as consumer.BatchConfig.Hooks, whose Event
// for the message ends it. A batch handler's spans started from
// msgs[i].Context() and its outputs for msgs[i] (which carry that context
// to [Tracer.Outputs]) are then under msgs[i]'s consumer span:
//
//	bc, err := consumer.NewBatchConsumer(store, handle, &consumer.BatchConfig{Config: consumer.Config{Scope: "ledger", Hooks: tr}})
//	err = bc.Subscribe(ctx, tr.Subscriber(sub), "commands")
//
// Through the outbox: the outbox stores each message's metadata with its
// row, so trace context injected when the message is written
// ([Tracer.Inject], or [Tracer.Outputs] for consumer.Config.Outputs) is
// still there when the relay publishes it; a relay publishing through
// [Tracer.Publisher] starts its producer span as a child of it, and the
// consumer's span is a child of that.
package eotel

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/exactly-go/exactly/plugin/eotel"

// Attribute keys of the spans that name what exactly did.
const (
	AttrScope    = attribute.Key("exactly.scope")
	AttrKey      = attribute.Key("exactly.key")
	AttrOutcome  = attribute.Key("exactly.outcome")
	AttrAttempts = attribute.Key("exactly.attempts")
	AttrHandler  = attribute.Key("exactly.handler")
)

// Attribute keys of the spans from OpenTelemetry's semantic conventions
// for messaging.
const (
	AttrSystem    = attribute.Key("messaging.system")
	AttrOperation = attribute.Key("messaging.operation.type")
	AttrTopic     = attribute.Key("messaging.destination.name")
	AttrPartition = attribute.Key("messaging.destination.partition.id")
	AttrOffset    = attribute.Key("messaging.kafka.offset")
	AttrKafkaKey  = attribute.Key("messaging.kafka.message.key")
	AttrMessageID = attribute.Key("messaging.message.id")
)

// Config configures [New]. The zero value (or nil) is ready to use.
type Config struct {
	// TracerProvider makes the spans. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator writes and reads trace context in message metadata.
	// Defaults to propagation.TraceContext{} (W3C traceparent and
	// tracestate), whatever the global propagator is.
	Propagator propagation.TextMapPropagator
}

// Tracer makes the spans. It implements [consumer.Hooks].
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

var _ consumer.Hooks = (*Tracer)(nil)

// New returns a Tracer. cfg may be nil.
func New(cfg *Config) *Tracer {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	return &Tracer{tracer: c.TracerProvider.Tracer(ScopeName), prop: c.Propagator}
}

func carrier(msg *message.Message) propagation.MapCarrier {
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	return propagation.MapCarrier(msg.Metadata)
}

// Inject writes the trace context of ctx's span into each message's
// metadata, where [Tracer.Extract] (and [Tracer.Middleware], and
// [Tracer.Publisher]) find it. Call it before writing messages to the
// outbox. Without a span in ctx it does nothing.
func (t *Tracer) Inject(ctx context.Context, msgs ...*message.Message) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	for _, m := range msgs {
		t.prop.Inject(ctx, carrier(m))
	}
}

// Extract returns ctx with the trace context found in msg's metadata (ctx
// itself when there is none).
func (t *Tracer) Extract(ctx context.Context, msg *message.Message) context.Context {
	return t.prop.Extract(ctx, carrier(msg))
}

type spanKey struct{}

// msgSpan is the consumer span of one delivery, in its message's context
// under spanKey. A span the Subscriber started ends with the delivery's
// first Event ([Tracer.OnMessage]); one the Middleware started, when the
// Middleware returns.
type msgSpan struct {
	span trace.Span
	// subscriber: started by the Subscriber, ended by OnMessage.
	subscriber bool
	ended      atomic.Bool
}

// spanOf returns the delivery's consumer span in ctx, if any.
func spanOf(ctx context.Context) (*msgSpan, bool) {
	ms, ok := ctx.Value(spanKey{}).(*msgSpan)
	return ms, ok
}

// consumerAttrs are a delivery's attributes, from its context and metadata.
func consumerAttrs(ctx context.Context, msg *message.Message) (topic string, attrs []attribute.KeyValue) {
	src, fromKafka := dedupe.SourceFromContext(ctx)
	topic, partition, offset := src.Topic, src.Partition, src.Offset
	if !fromKafka {
		topic = message.SubscribeTopicFromCtx(ctx)
	}
	attrs = []attribute.KeyValue{AttrOperation.String("process"), AttrMessageID.String(msg.UUID)}
	if topic != "" {
		attrs = append(attrs, AttrTopic.String(topic))
	}
	if fromKafka {
		attrs = append(attrs, AttrSystem.String("kafka"),
			AttrPartition.String(strconv.Itoa(int(partition))), AttrOffset.Int64(offset))
		if k := msg.Metadata.Get(kafkapubsub.MetadataKafkaKey); k != "" {
			attrs = append(attrs, AttrKafkaKey.String(k))
		}
	}
	return topic, attrs
}

// Middleware starts a consumer span per delivery, child of the trace context
// in the message's metadata, and hands its context to the handlers it wraps
// (msg.Context()). The span ends with an error status when the delivery
// fails. Output messages without trace context get the span's.
func (t *Tracer) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if ms, ok := spanOf(msg.Context()); ok && ms.subscriber && !ms.ended.Load() {
			// The Subscriber started this delivery's span: it is the one,
			// and the delivery's Event ends it.
			if name := message.HandlerNameFromCtx(msg.Context()); name != "" {
				ms.span.SetAttributes(AttrHandler.String(name))
			}
			outs, err := h(msg)
			return t.injectOutputs(ms.span, outs, err)
		}
		ctx := t.Extract(msg.Context(), msg)
		topic, attrs := consumerAttrs(msg.Context(), msg)
		if name := message.HandlerNameFromCtx(ctx); name != "" {
			attrs = append(attrs, AttrHandler.String(name))
		}
		ctx, span := t.tracer.Start(ctx, spanName("process", topic),
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
		defer span.End()
		msg.SetContext(context.WithValue(ctx, spanKey{}, &msgSpan{span: span}))

		outs, err := h(msg)
		outs, err = t.injectOutputs(span, outs, err)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		return outs, err
	}
}

// injectOutputs gives the outputs without trace context the context of
// span: they go out after the handler returned, through the router's
// publisher, without the span's cancellation.
func (t *Tracer) injectOutputs(span trace.Span, outs []*message.Message, err error) ([]*message.Message, error) {
	sc := span.SpanContext()
	for _, o := range outs {
		if o == nil || trace.SpanContextFromContext(t.Extract(context.Background(), o)).IsValid() {
			continue
		}
		t.Inject(trace.ContextWithSpanContext(context.Background(), sc), o)
	}
	return outs, err
}

func spanName(op, topic string) string {
	if topic == "" {
		return op
	}
	return op + " " + topic
}

// OnMessage implements [consumer.Hooks]: it sets the scope, key, outcome and
// attempts on the span that [Tracer.Middleware] started for the message,
// and an error status when the outcome is a failure. Used without the
// Middleware, it records a span of its own covering ev.Duration, child of
// whatever span ctx holds.
func (t *Tracer) OnMessage(ctx context.Context, ev consumer.Event) {
	attrs := []attribute.KeyValue{AttrScope.String(ev.Scope), AttrOutcome.String(string(ev.Outcome)),
		AttrAttempts.Int(ev.Attempts)}
	if ev.Key != "" {
		attrs = append(attrs, AttrKey.String(ev.Key))
	}
	ms, ours := spanOf(ctx)
	var span trace.Span
	switch {
	case ours && ms.subscriber && ms.ended.CompareAndSwap(false, true):
		// The delivery's first Event ends the span the Subscriber started.
		span = ms.span
		defer span.End()
	case ours && !ms.subscriber:
		span = ms.span // the Middleware ends it
	default:
		ours = false
	}
	if !ours {
		end := time.Now()
		attrs = append(attrs, AttrOperation.String("process"))
		if ev.Topic != "" {
			attrs = append(attrs, AttrTopic.String(ev.Topic))
		}
		if ev.Offset >= 0 {
			attrs = append(attrs, AttrSystem.String("kafka"),
				AttrPartition.String(strconv.Itoa(int(ev.Partition))), AttrOffset.Int64(ev.Offset))
		}
		_, span = t.tracer.Start(ctx, spanName("process", ev.Topic), trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithTimestamp(end.Add(-ev.Duration)))
		defer span.End(trace.WithTimestamp(end))
	}
	span.SetAttributes(attrs...)
	if ev.Err != nil {
		span.RecordError(ev.Err)
		span.SetStatus(codes.Error, string(ev.Outcome)+": "+ev.Err.Error())
	}
}

// Outputs wraps w (consumer.Config.Outputs) so that each output message
// written to the outbox carries the trace context of the handler's span,
// or, when the message's own context holds a span (a batch's outputs carry
// their command's), that one's.
func (t *Tracer) Outputs(w consumer.OutputsWriter) consumer.OutputsWriter {
	return outputs{t: t, w: w}
}

type outputs struct {
	t *Tracer
	w consumer.OutputsWriter
}

func (o outputs) WriteOutputsTx(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	for _, m := range msgs {
		if m == nil {
			continue
		}
		// A batch's outputs carry their own command's context (its
		// trace); others get the handler's, ctx.
		if mctx := m.Context(); trace.SpanContextFromContext(mctx).IsValid() {
			o.t.Inject(mctx, m)
		} else {
			o.t.Inject(ctx, m)
		}
	}
	return o.w.WriteOutputsTx(ctx, tx, msgs)
}

// Publisher wraps pub: each message published gets a producer span, child of
// the span in msg.Context() or, without one, of the trace context in its
// metadata (a message the outbox relay publishes), and the producer span's
// context is written into the message's metadata, which the Kafka Publisher
// sends as record headers. The spans end when pub.Publish returns, with an
// error status when it failed.
func (t *Tracer) Publisher(pub message.Publisher) message.Publisher {
	return &publisher{t: t, pub: pub}
}

type publisher struct {
	t   *Tracer
	pub message.Publisher
}

func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	spans := make([]trace.Span, 0, len(msgs))
	for _, m := range msgs {
		ctx := m.Context()
		if !trace.SpanContextFromContext(ctx).IsValid() {
			ctx = p.t.Extract(ctx, m)
		}
		attrs := []attribute.KeyValue{AttrOperation.String("send"), AttrTopic.String(topic), AttrMessageID.String(m.UUID)}
		if k := m.Metadata.Get(kafkapubsub.MetadataKafkaKey); k != "" {
			attrs = append(attrs, AttrKafkaKey.String(k))
		}
		ctx, span := p.t.tracer.Start(ctx, spanName("send", topic), trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attrs...))
		p.t.prop.Inject(ctx, carrier(m))
		spans = append(spans, span)
	}
	err := p.pub.Publish(topic, msgs...)
	for _, s := range spans {
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, err.Error())
		}
		s.End()
	}
	return err
}

func (p *publisher) Close() error { return p.pub.Close() }

// Subscriber wraps sub: each message it delivers carries, in its context,
// a consumer span started at delivery, child of the trace context found in
// its metadata (the producer's span), so that whatever reads msg.Context()
// is under it: a handler's own spans, the outputs a batch handler returns
// for it. The delivery's first Event ([Tracer.OnMessage]) sets its
// outcome and ends it; [Tracer.Middleware] uses it instead of starting one.
// Messages are passed on as they are, so acks and nacks reach sub.
func (t *Tracer) Subscriber(sub message.Subscriber) message.Subscriber {
	return &subscriber{t: t, sub: sub}
}

type subscriber struct {
	t   *Tracer
	sub message.Subscriber
}

func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	subTopic := topic
	in, err := s.sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for m := range in {
			// The delivery's consumer span starts here, child of its
			// producer's span, so that everything the message's context
			// reaches (the handler's spans, a batch handler's outputs)
			// is under it; its first Event ends it.
			ctx := s.t.Extract(m.Context(), m)
			topic, attrs := consumerAttrs(m.Context(), m)
			if topic == "" {
				topic = subTopic
			}
			ctx, span := s.t.tracer.Start(ctx, spanName("process", topic),
				trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
			m.SetContext(context.WithValue(ctx, spanKey{}, &msgSpan{span: span, subscriber: true}))
			select {
			case out <- m:
			case <-ctx.Done():
				// Nobody reads any more; sub delivers it again, as any
				// message of an ended subscription that was not acked.
			}
		}
	}()
	return out, nil
}

func (s *subscriber) Close() error { return s.sub.Close() }
