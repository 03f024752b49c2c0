package eotel_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/plugin/eotel"
	"github.com/exactly-go/exactly/worker"
)

// The Tracer as one plugin of two workers chained by the outbox gives one
// whole trace: the producer's request → its send span → the first worker's
// consumer span (outcome applied) → the relay's send span of the event →
// the second worker's consumer span. A copy of the command is a consumer
// span with outcome duplicate, in the same trace, and publishes nothing.
func TestWholeTraceThroughTwoWorkers(t *testing.T) {
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t)
			brokers := kafkatest.Brokers(t)
			commands, events := kafkatest.Topic(t, 1), kafkatest.Topic(t, 1)
			for _, dlq := range []string{commands + ".dlq", events + ".dlq"} {
				kafkatest.CreateTopic(t, dlq, 1)
			}
			apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
				// The handler's own span, from its message's context (a
				// batch handler's ctx is the batch's).
				_, own := w.tp.Tracer("handler").Start(msg.Context(), "handler work")
				defer own.End()
				if _, err := tx.Exec(ctx, "INSERT INTO "+w.db.Table("applied")+" VALUES ($1)", msg.UUID); err != nil {
					return nil, err
				}
				if message.SubscribeTopicFromCtx(ctx) == events || strings.HasPrefix(msg.UUID, "out-") {
					return nil, nil
				}
				return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, nil
			}
			start := func(scope, topic, output string) {
				cfg := &worker.Config{Scope: scope, Schema: w.db.Schema, Brokers: brokers, Topic: topic, OutputTopic: output,
					Group: kafkatest.Name("g"), Handler: apply, Tables: []string{"applied"}, Logger: quiet(),
					StartupBackoff: 200 * time.Millisecond, RelayPollInterval: 50 * time.Millisecond,
					Plugins: []worker.Plugin{w.tr}}
				if mode == "batch" {
					cfg.Handler, cfg.BatchSize = nil, 10
					cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
						outs := make([][]*message.Message, len(msgs))
						for i, m := range msgs {
							o, err := apply(ctx, tx, m)
							if err != nil {
								return nil, err
							}
							outs[i] = o
						}
						return outs, nil
					}
				}
				wk, err := worker.New(w.db.Pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- wk.Run(ctx) }()
				t.Cleanup(func() {
					cancel()
					if err := <-done; err != nil {
						t.Errorf("worker %s: %v", scope, err)
					}
				})
			}
			start("first", commands, events)
			start("second", events, "")

			kpub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			pub := w.tr.Publisher(kpub)
			defer pub.Close()
			ctx, root := w.tp.Tracer("test").Start(context.Background(), "request")
			for range 2 { // the command, and a copy of it
				msg := message.NewMessage("cmd-1", []byte(`{"n":1}`))
				msg.SetContext(ctx)
				if err := pub.Publish(commands, msg); err != nil {
					t.Fatal(err)
				}
			}
			root.End()
			traceID := root.SpanContext().TraceID()

			testenv.WaitFor(t, time.Minute, "the event consumed by the second worker", func() bool {
				return len(spans(w.rec, trace.SpanKindConsumer, "process "+events)) >= 1 &&
					len(spans(w.rec, trace.SpanKindConsumer, "process "+commands)) >= 2
			})
			byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
			for _, s := range w.rec.Ended() {
				byID[s.SpanContext().SpanID()] = s
				if s.SpanContext().TraceID() != traceID {
					t.Errorf("span %q in trace %s, want the request's %s", s.Name(), s.SpanContext().TraceID(), traceID)
				}
			}
			parentName := func(s sdktrace.ReadOnlySpan) string {
				if p, ok := byID[s.Parent().SpanID()]; ok {
					return p.Name()
				}
				return "?"
			}
			outcomes := map[string]int{}
			for _, c := range spans(w.rec, trace.SpanKindConsumer, "process "+commands) {
				outcomes[attrs(c)[eotel.AttrOutcome].AsString()]++
				if got := parentName(c); got != "send "+commands {
					t.Errorf("%q's parent is %q, want the command's send span", c.Name(), got)
				}
			}
			if outcomes["applied"] != 1 || outcomes["duplicate"] != 1 {
				t.Errorf("outcomes of the command's deliveries %v, want one applied and one duplicate", outcomes)
			}
			for _, h := range spans(w.rec, trace.SpanKindInternal, "handler work") {
				if got := parentName(h); got != "process "+commands && got != "process "+events {
					t.Errorf("the handler's span's parent is %q, want its command's consumer span", got)
				}
			}
			if n := len(spans(w.rec, trace.SpanKindInternal, "handler work")); n != 2 {
				t.Errorf("%d handler spans, want 2 (the command once, the event once; the duplicate runs nothing)", n)
			}
			relays := spans(w.rec, trace.SpanKindProducer, "send "+events)
			if len(relays) != 1 {
				t.Fatalf("%d send spans for the events topic, want 1 (the duplicate publishes nothing)", len(relays))
			}
			// The event's send span is a child of the consumer span of the
			// command that returned it, in both modes.
			want := "process " + commands
			if got := parentName(relays[0]); got != want {
				t.Errorf("the event's send span's parent is %q, want %q", got, want)
			}
			second := spans(w.rec, trace.SpanKindConsumer, "process "+events)
			if len(second) != 1 || second[0].Parent().SpanID() != relays[0].SpanContext().SpanID() {
				t.Errorf("the second worker's spans %d, parent %q; want 1, child of the event's send span", len(second), parentName(second[0]))
			}
			if got := attrs(second[0])[eotel.AttrOutcome].AsString(); got != "applied" {
				t.Errorf("the second worker's outcome %q, want applied", got)
			}
			if n := kafkatest.EndOffsets(t, events, 1)[0]; n != 1 {
				t.Errorf("%d records on the events topic, want 1", n)
			}
			t.Logf("the trace %s:", traceID)
			for _, s := range w.rec.Ended() {
				t.Logf("  %-28s %-9s parent %s", s.Name(), s.SpanKind(), parentName(s))
			}
		})
	}
}
