package rebalancebench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// The worker's environment: workerEnv set makes the test binary a group
// member instead of running tests.
const (
	workerEnv   = "REBALANCEBENCH_WORKER"
	modeEnv     = "REBALANCEBENCH_MODE"
	brokersEnv  = "REBALANCEBENCH_BROKERS"
	topicEnv    = "REBALANCEBENCH_TOPIC"
	groupEnv    = "REBALANCEBENCH_GROUP"
	instanceEnv = "REBALANCEBENCH_INSTANCE"
)

// The modes: the Subscriber a worker consumes with.
const (
	modeEager       = "eager"       // kafkapubsub: kafka-go's eager group
	modeCooperative = "cooperative" // kgopubsub's defaults: classic, cooperative-sticky
	modeStatic      = "static"      // kgopubsub, classic, with InstanceID
	modeKIP848      = "kip848"      // kgopubsub with ProtocolConsumer
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(worker())
	}
	os.Exit(m.Run())
}

// out writes the worker's report lines to stdout, one write per line:
//
//	r <partition> <offset> <unix nanoseconds>   a message received (then acked)
//	g <generation>                              the member joined a generation
//	closing / closed                            SIGTERM seen / subscription ended
type out struct{ mu sync.Mutex }

func (o *out) line(format string, args ...any) {
	s := fmt.Sprintf(format+"\n", args...)
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = os.Stdout.WriteString(s)
}

// worker consumes the topic in the group with the mode's Subscriber, acks
// every message and reports it, until SIGTERM, on which it closes the
// Subscriber (drain, commit, leave) and exits.
func worker() int {
	o := &out{}
	logger := slog.New(&reportHandler{inner: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}), out: o})
	brokers := strings.Split(os.Getenv(brokersEnv), ",")
	group, topic := os.Getenv(groupEnv), os.Getenv(topicEnv)
	var sub message.Subscriber
	var err error
	switch mode := os.Getenv(modeEnv); mode {
	case modeEager:
		sub, err = kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Logger: logger})
	case modeCooperative, modeStatic, modeKIP848:
		cfg := kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Logger: logger}}
		if mode == modeStatic {
			cfg.InstanceID = os.Getenv(instanceEnv)
		}
		if mode == modeKIP848 {
			cfg.GroupProtocol = kgopubsub.ProtocolConsumer
		}
		sub, err = kgopubsub.NewSubscriber(&cfg)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: subscribe:", err)
		return 2
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sig
		o.line("closing")
		_ = sub.Close()
	}()
	for m := range ch {
		now := time.Now().UnixNano()
		p, off := m.Metadata.Get(kafkapubsub.MetadataPartition), m.Metadata.Get(kafkapubsub.MetadataOffset)
		m.Ack()
		o.line("r %s %s %d", p, off, now)
	}
	o.line("closed")
	return 0
}

// reportHandler logs to inner (the worker's stderr) and reports the
// generation of every join: franz-go's "joined" under the classic protocol,
// kafkapubsub's "generation started".
type reportHandler struct {
	inner slog.Handler
	out   *out
}

func (h *reportHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *reportHandler) Handle(ctx context.Context, r slog.Record) error {
	switch r.Message {
	case "franz-go: joined", "franz-go: joined, balancing group", "franz-go: joined as leader but unable to balance group due to KIP-345 limitations",
		"kafkapubsub: generation started":
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "generation" {
				h.out.line("g %v", a.Value.Any())
				return false
			}
			return true
		})
	}
	return h.inner.Handle(ctx, r)
}

func (h *reportHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &reportHandler{inner: h.inner.WithAttrs(as), out: h.out}
}

func (h *reportHandler) WithGroup(name string) slog.Handler {
	return &reportHandler{inner: h.inner.WithGroup(name), out: h.out}
}
