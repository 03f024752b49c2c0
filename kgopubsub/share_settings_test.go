package kgopubsub_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// newShareSub returns a ShareSubscriber of group with isolation and start,
// closed when the test ends.
func newShareSub(t *testing.T, group string, isolation kafkapubsub.Isolation, start kafkapubsub.StartOffset) *kgopubsub.ShareSubscriber {
	t.Helper()
	sub, err := kgopubsub.NewShareSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
		Brokers: kafkatest.Brokers(t), ConsumerGroup: group, Logger: quietLogger(), Isolation: isolation, StartOffset: start}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// produceTxn produces one record per payload to topic in a transaction,
// each with a message ID, and commits or aborts it.
func produceTxn(t *testing.T, topic string, end kgo.TransactionEndTry, payloads ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(t)...), kgo.TransactionalID(kafkatest.Name("tx")), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, p := range payloads {
		r := &kgo.Record{Value: []byte(p), Headers: []kgo.RecordHeader{{Key: kafkapubsub.UUIDHeader, Value: []byte(uuid.NewString())}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, end); err != nil {
		t.Fatal(err)
	}
}

// A ShareSubscriber with ReadUncommitted that subscribes once to the share
// group of a read-committed member (and closes) does not make that member
// apply the records of aborted transactions: the group's isolation level is
// every member's, so the second member is refused, and the group keeps its
// setting.
func TestShareGroupSettingsNotChangedByAMember(t *testing.T) {
	t.Parallel()
	requireShareGroups(t)
	topic, group := kafkatest.Topic(t, 1), kafkatest.Name("sg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, err := newShareSub(t, group, kafkapubsub.ReadCommitted, kafkapubsub.StartFirst).Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	uncommitted := newShareSub(t, group, kafkapubsub.ReadUncommitted, kafkapubsub.StartFirst)
	_, refusedRU := uncommitted.Subscribe(ctx, topic)
	_ = uncommitted.Close()

	produceTxn(t, topic, kgo.TryAbort, "aborted", "aborted")
	produceTxn(t, topic, kgo.TryCommit, "committed")
	var mu sync.Mutex
	applied := map[string]int{}
	go func() {
		for msg := range ch {
			mu.Lock()
			applied[string(msg.Payload)]++
			mu.Unlock()
			msg.Ack()
		}
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		mu.Lock()
		got := applied["committed"]
		mu.Unlock()
		done, offsets := shareGroupDone(t, group, topic, 1)
		if got > 0 && done {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("gave up waiting for the committed command applied and the group done: applied %v; the group: %s; "+
				"the second member's Subscribe: %v", applied, offsets, refusedRU)
		}
	}
	cancel()
	mu.Lock()
	defer mu.Unlock()
	if applied["aborted"] != 0 || applied["committed"] != 1 {
		t.Errorf("the read-committed member applied %v, want the committed command once and no aborted one", applied)
	}
	if !errors.Is(refusedRU, kgopubsub.ErrShareGroupSettings) || !strings.Contains(refusedRU.Error(), "share.isolation.level") {
		t.Errorf("Subscribe with ReadUncommitted on a read-committed group: %v, want ErrShareGroupSettings naming share.isolation.level", refusedRU)
	}
}

// A StartLast member that subscribes once to the share group of a StartFirst
// member, before the group has fetched anything, does not make the group
// skip the records produced before: it is refused.
func TestShareGroupStartNotChangedByAMember(t *testing.T) {
	t.Parallel()
	requireShareGroups(t)
	topic, group := kafkatest.Topic(t, 1), kafkatest.Name("sg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := newShareSub(t, group, kafkapubsub.ReadCommitted, kafkapubsub.StartFirst)
	last := newShareSub(t, group, kafkapubsub.ReadCommitted, kafkapubsub.StartLast)
	// The first member sets the group, and leaves before it fetched.
	if _, err := first.Subscribe(ctx, topic); err != nil {
		t.Fatal(err)
	}
	_ = first.Close()
	_, refused := last.Subscribe(ctx, topic)
	_ = last.Close()
	produceTxn(t, topic, kgo.TryCommit, "before")
	ch, err := newShareSub(t, group, kafkapubsub.ReadCommitted, kafkapubsub.StartFirst).Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-ch:
		msg.Ack()
	case <-ctx.Done():
		t.Fatalf("the record produced before the group's first fetch was never delivered (the StartLast member's Subscribe: %v)", refused)
	}
	if !errors.Is(refused, kgopubsub.ErrShareGroupSettings) || !strings.Contains(refused.Error(), "share.auto.offset.reset") {
		t.Fatalf("Subscribe with StartLast on a group that starts from the earliest: %v, want ErrShareGroupSettings naming share.auto.offset.reset", refused)
	}
}

// A share group's isolation level changed under a running read-committed
// member (by a tool, an operator): the member's subscription ends (a
// worker stops, and is refused when it starts again) rather than go on
// under a setting that hands it aborted records, and the group keeps the
// setting it was given.
func TestShareGroupSettingsChangedWhileRunning(t *testing.T) {
	t.Parallel()
	requireShareGroups(t)
	topic, group := kafkatest.Topic(t, 1), kafkatest.Name("sg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, err := newShareSub(t, group, kafkapubsub.ReadCommitted, kafkapubsub.StartFirst).Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	setShareGroup(t, group, map[string]string{"share.isolation.level": "read_uncommitted"})
	select {
	case msg, open := <-ch:
		if open {
			t.Fatalf("delivered %q on an empty topic", msg.Payload)
		}
	case <-ctx.Done():
		t.Fatal("the read-committed member's subscription still runs on a group set to read uncommitted")
	}
	if _, err := newShareSub(t, group, kafkapubsub.ReadCommitted, kafkapubsub.StartFirst).Subscribe(ctx, topic); !errors.Is(err, kgopubsub.ErrShareGroupSettings) {
		t.Fatalf("Subscribe again: %v, want ErrShareGroupSettings", err)
	}
}

// franz-go options in a ShareSubscriber's Options that would undo what its
// member needs of its client (fetching only what it hands out, copies made
// at once, durably and idempotently, the group and topic it was given) are
// refused at Subscribe, with the option's name; options that do not are
// accepted.
func TestShareOptionsBreakingTheContractRefused(t *testing.T) {
	t.Parallel()
	requireShareGroups(t)
	topic, group := kafkatest.Topic(t, 1), kafkatest.Name("sg")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, c := range map[string]struct {
		opt  kgo.Opt
		want string
	}{
		"fetch ahead":     {kgo.MaxConcurrentFetches(2), "MaxConcurrentFetches"},
		"more records":    {kgo.ShareMaxRecords(10), "ShareMaxRecords"},
		"another group":   {kgo.ShareGroup("other"), "ShareGroup"},
		"another topic":   {kgo.ConsumeTopics("other"), "ConsumeTopics"},
		"linger":          {kgo.ProducerLinger(50 * time.Millisecond), "ProducerLinger"},
		"leader acks":     {kgo.RequiredAcks(kgo.LeaderAck()), "RequiredAcks"},
		"not idempotent":  {kgo.DisableIdempotentWrite(), "DisableIdempotentWrite"},
		"harmless (none)": {kgo.ClientID("exactly-test"), ""},
	} {
		opts := []kgo.Opt{c.opt}
		if c.want == "RequiredAcks" {
			opts = append(opts, kgo.DisableIdempotentWrite()) // franz-go refuses leader acks with idempotency
		}
		sub, err := kgopubsub.NewShareSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
			Brokers: kafkatest.Brokers(t), ConsumerGroup: group, Logger: quietLogger()}, Options: opts})
		if err != nil {
			t.Fatal(err)
		}
		_, err = sub.Subscribe(ctx, topic)
		_ = sub.Close()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: Subscribe: %v, want it accepted", name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: Subscribe: %v, want it refused naming %s", name, err, c.want)
		}
	}
}
