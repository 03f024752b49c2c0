package kgopubsub_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
	"github.com/exactly-go/exactly/worker"
)

// shareTransport is the worker's Transport on a share group.
var shareTransport = kgopubsub.Transport{GroupProtocol: kgopubsub.ProtocolShare}

// requireShareGroups skips t on brokers without share groups (Kafka 3.9
// in the version matrix), where TestShareSubscriberWithoutShareGroups
// checks the error instead.
func requireShareGroups(t *testing.T) {
	t.Helper()
	kafkatest.RequireReal(t)
	if !shareGroupsServed(t) {
		t.Skip("the broker does not serve share groups; TestShareSubscriberWithoutShareGroups checks the error")
	}
}

func shareGroupsServed(t *testing.T) bool {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(t)...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range resp.ApiKeys {
		if k.ApiKey == kmsg.ShareGroupHeartbeat.Int16() {
			return true
		}
	}
	return false
}

// On a broker without share groups, Subscribe fails at once with
// ErrNoShareGroups.
func TestShareSubscriberWithoutShareGroups(t *testing.T) {
	t.Parallel()
	kafkatest.RequireReal(t)
	if shareGroupsServed(t) {
		t.Skip("the broker serves share groups (Kafka 3.9 in the version matrix runs this test)")
	}
	sub, err := kgopubsub.NewShareSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
		Brokers: kafkatest.Brokers(t), ConsumerGroup: kafkatest.Name("sg"), Logger: quietLogger()}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := sub.Subscribe(context.Background(), kafkatest.Topic(t, 1)); !errors.Is(err, kgopubsub.ErrNoShareGroups) {
		t.Fatalf("Subscribe: %v, want ErrNoShareGroups", err)
	}
}

// setShareGroup sets configurations of the share group before its first
// member joins (the lock duration, the delivery limit).
func setShareGroup(t *testing.T, group string, conf map[string]string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(t)...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	err = kgopubsub.AlterGroupConfig(context.Background(), cl, group, conf)
	if errors.Is(err, kerr.InvalidConfig) {
		// A broker with the default floors (a lock of 15s or more, a
		// session of 45s): scripts/kafka/server.properties lowers them.
		t.Skipf("the broker refuses the share group's %v (its group.share.min.* floors are the defaults): %v", conf, err)
	}
	if err != nil {
		t.Fatalf("set the share group %s's %v: %v", group, conf, err)
	}
}

// shareGroupDone says whether the share group has acknowledged (or
// archived) every record of topic: the broker counts none left on any
// partition that has records (its start offset is persisted later, in
// steps; a partition without records may have none, -1). It also says
// what the broker answered, for a test that gives up.
func shareGroupDone(t *testing.T, group, topic string, partitions int) (bool, string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(t)...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDescribeShareGroupOffsetsRequest()
	g := kmsg.NewDescribeShareGroupOffsetsRequestGroup()
	g.GroupID = group
	gt := kmsg.NewDescribeShareGroupOffsetsRequestGroupTopic()
	gt.Topic = topic
	for p := range partitions {
		gt.Partitions = append(gt.Partitions, int32(p))
	}
	g.Topics = append(g.Topics, gt)
	req.Groups = append(req.Groups, g)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil || len(resp.Groups) != 1 || len(resp.Groups[0].Topics) != 1 {
		return false, fmt.Sprintf("DescribeShareGroupOffsets: %v", err)
	}
	end := kafkatest.EndOffsets(t, topic, partitions)
	done, parts := len(resp.Groups[0].Topics[0].Partitions) == partitions, []string{}
	for _, p := range resp.Groups[0].Topics[0].Partitions {
		if end[int(p.Partition)] == 0 {
			continue // no record: the group may never have fetched it (start -1)
		}
		if p.ErrorCode != 0 || p.StartOffset < 0 || p.Lag != 0 {
			done = false
		}
		parts = append(parts, fmt.Sprintf("%d: start %d lag %d error %d", p.Partition, p.StartOffset, p.Lag, p.ErrorCode))
	}
	return done, strings.Join(parts, "; ")
}

// appliedTable creates the table the tests' handlers count their
// applications in, and returns its name.
func appliedTable(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	applied := db.Table("applied")
	if _, err := db.Pool.Exec(context.Background(), "CREATE TABLE "+applied+" (id text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return applied
}

// applyOnce counts msg's application in the applied table, in tx.
func applyOnce(ctx context.Context, tx pgx.Tx, applied string, msg *message.Message) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+applied+" VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = applied.n + 1", msg.UUID)
	return err
}

// waitAppliedOnce waits until n commands are applied and the share group
// is done with topic, then checks that each was applied exactly once.
func waitAppliedOnce(t *testing.T, db *pgtest.DB, applied, group, topic string, partitions, n int, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(d); ; time.Sleep(200 * time.Millisecond) {
		var got int
		err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+applied).Scan(&got)
		done, offsets := shareGroupDone(t, group, topic, partitions)
		if err != nil {
			done, offsets = false, fmt.Sprintf("%s (the count of applied commands failed: %v)", offsets, err)
		}
		if got >= n && done {
			break
		}
		if time.Now().After(deadline) {
			end := kafkatest.EndOffsets(t, topic, partitions)
			t.Fatalf("gave up after %v waiting for every command applied and every record acknowledged: %d of %d applied; "+
				"the group's partitions: %s; the end offsets: %v", d, got, n, offsets, end)
		}
	}
	var once, twice int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE n > 1) FROM "+applied).
		Scan(&once, &twice); err != nil || once != n || twice != 0 {
		t.Fatalf("applied once %d, more than once %d (%v); want %d and 0", once, twice, err, n)
	}
}

// shareWorkers runs n workers of cfg on the share group at once, until the
// test ends.
func shareWorkers(t *testing.T, db *pgtest.DB, n int, cfg func(i int) *worker.Config) {
	t.Helper()
	for i := range n {
		c := cfg(i)
		c.Transport = shareTransport
		wk, err := worker.New(db.Pool, c)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- wk.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker %d: Run: %v", i, err)
			}
		})
	}
}

// Two workers on one share group: every command, each sent twice and the
// copies spread over partitions (so that both workers may hold one at
// once), is applied once; the outputs go out once; a command that fails
// for good is dead-lettered with its reason and not delivered again; the
// group acknowledges every record. Per-message and batch mode.
func TestShareWorkersApplyOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			requireShareGroups(t)
			db := pgtest.New(t)
			commands, events, dlq := kafkatest.Topic(t, 3), kafkatest.Topic(t, 3), kafkatest.Topic(t, 1)
			group := kafkatest.Name("sg")
			applied := appliedTable(t, db)
			var poisoned atomic.Int32
			apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
				if string(msg.Payload) == "poison" {
					if msg.Metadata.Get(kgopubsub.MetadataDeliveryCount) != "1" {
						poisoned.Add(1)
					}
					return nil, dedupe.Permanent(errors.New("not a command"))
				}
				if err := applyOnce(ctx, tx, applied, msg); err != nil {
					return nil, err
				}
				return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, nil
			}
			shareWorkers(t, db, 2, func(int) *worker.Config {
				cfg := &worker.Config{Scope: "test", Schema: db.Schema, Brokers: kafkatest.Brokers(t), Topic: commands, OutputTopic: events,
					DeadLetterTopic: dlq, Group: group, Handler: apply, Tables: []string{"applied"}, MaxInFlight: 4,
					Logger: quietLogger(), StartupBackoff: 200 * time.Millisecond}
				if mode == "batch" {
					cfg.Handler, cfg.BatchSize, cfg.MaxInFlight = nil, 20, 0
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
				return cfg
			})
			const n = 60
			var msgs []*message.Message
			for i := range n {
				m := message.NewMessage(uuid.NewString(), []byte(fmt.Sprintf(`{"n": %d}`, i)))
				msgs = append(msgs, m, m.Copy())
			}
			msgs = append(msgs, message.NewMessage(uuid.NewString(), []byte("poison")))
			publish(t, commands, msgs...)
			waitAppliedOnce(t, db, applied, group, commands, 3, n, 2*time.Minute)
			testenv.WaitFor(t, time.Minute, "the outputs and the dead letter published", func() bool {
				ev := kafkatest.EndOffsets(t, events, 3)
				return ev[0]+ev[1]+ev[2] >= n && kafkatest.EndOffsets(t, dlq, 1)[0] >= 1
			})
			if ev := kafkatest.EndOffsets(t, events, 3); ev[0]+ev[1]+ev[2] != n {
				t.Fatalf("%v outputs, want %d: one per command", ev, n)
			}
			dead := kafkatest.ReadAll(t, dlq, 1, 10*time.Second)
			if len(dead) != 1 || string(dead[0].Value) != "poison" || !hasHeader(dead[0].Headers, middleware.ReasonForPoisonedKey, "not a command") {
				t.Fatalf("dead letters %v, want the poison with its reason", dead)
			}
			if got := poisoned.Load(); got != 0 {
				t.Fatalf("the poison was delivered again %d times: rejected, it should not be", got)
			}
		})
	}
}

func hasHeader(hs []kafka.Header, key, contains string) bool {
	for _, h := range hs {
		if h.Key == key && strings.Contains(string(h.Value), contains) {
			return true
		}
	}
	return false
}

// A handler slower than the record's lock: the broker hands the record to
// the other worker while the first still applies it. The two copies run at
// once, and the command is applied once.
func TestShareLockTimeoutAppliesOnce(t *testing.T) {
	t.Parallel()
	requireShareGroups(t)
	db := pgtest.New(t)
	commands, dlq := kafkatest.Topic(t, 2), kafkatest.Topic(t, 1)
	group := kafkatest.Name("sg")
	setShareGroup(t, group, map[string]string{"share.record.lock.duration.ms": "1000"})
	applied := appliedTable(t, db)
	var slowed sync.Map
	var redelivered atomic.Int32
	apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		if err := applyOnce(ctx, tx, applied, msg); err != nil {
			return nil, err
		}
		if _, loaded := slowed.LoadOrStore(msg.UUID, true); !loaded {
			// Past the lock's end, with the command applied in the open
			// transaction.
			time.Sleep(2500 * time.Millisecond)
		}
		return nil, nil
	}
	shareWorkers(t, db, 2, func(int) *worker.Config {
		return &worker.Config{Scope: "test", Schema: db.Schema, Brokers: kafkatest.Brokers(t), Topic: commands, Group: group, DeadLetterTopic: dlq,
			Handler: apply, Tables: []string{"applied"}, MaxInFlight: 2, Timeout: 20 * time.Second,
			Plugins: []worker.Plugin{countRedeliveries{&redelivered}},
			Logger:  quietLogger(), StartupBackoff: 200 * time.Millisecond}
	})
	const n = 6
	pub, err := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: kafkapubsub.PublisherConfig{Brokers: kafkatest.Brokers(t)}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := pub.Publish(commands, message.NewMessage(uuid.NewString(), []byte(strconv.Itoa(i)))); err != nil {
			t.Fatal(err)
		}
	}
	_ = pub.Close()
	waitAppliedOnce(t, db, applied, group, commands, 2, n, 2*time.Minute)
	if redelivered.Load() == 0 {
		t.Fatal("no record was delivered again after its lock ran out: the test did not run two copies at once")
	}
}

// countRedeliveries counts the deliveries after the first, duplicates
// included (the dedupe middleware does not call the handler for those).
type countRedeliveries struct{ n *atomic.Int32 }

func (c countRedeliveries) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if d, _ := strconv.Atoi(msg.Metadata.Get(kgopubsub.MetadataDeliveryCount)); d > 1 {
			c.n.Add(1)
		}
		return h(msg)
	}
}

// A record that fails on every delivery up to the group's limit is not
// lost to the broker's archive: before its last delivery (with a limit of
// 2), or its second to last (with 3), it is copied, unchanged, to the end
// of its partition, and the copy is delivered; the record is then
// accepted, not released, when its delivery fails: it is copied once.
func TestShareLastDeliveryCopied(t *testing.T) {
	t.Parallel()
	for _, limit := range []string{"2", "3"} {
		t.Run("limit "+limit, func(t *testing.T) {
			t.Parallel()
			testShareLastDeliveryCopied(t, limit)
		})
	}
}

// shareSubscription subscribes a ShareSubscriber (with nackBackoff, or the
// default when 0) to a new topic of one partition, as a member of a new
// share group set to conf, for up to two minutes (ctx; cancel ends it).
func shareSubscription(t *testing.T, conf map[string]string, nackBackoff time.Duration) (topic, group string, ch <-chan *message.Message, ctx context.Context, cancel context.CancelFunc) {
	t.Helper()
	requireShareGroups(t)
	topic, group = kafkatest.Topic(t, 1), kafkatest.Name("sg")
	setShareGroup(t, group, conf)
	sub, err := kgopubsub.NewShareSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
		Brokers: kafkatest.Brokers(t), ConsumerGroup: group, Logger: quietLogger(), NackBackoff: nackBackoff}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	if ch, err = sub.Subscribe(ctx, topic); err != nil {
		t.Fatal(err)
	}
	return topic, group, ch, ctx, cancel
}

func testShareLastDeliveryCopied(t *testing.T, limit string) {
	topic, group, ch, ctx, cancel := shareSubscription(t, map[string]string{"share.record.lock.duration.ms": "1000", "share.delivery.count.limit": limit},
		300*time.Millisecond)
	id := uuid.NewString()
	publish(t, topic, message.NewMessage(id, []byte("command")))
	var seen []string
	for msg := range ch {
		seen = append(seen, msg.Metadata.Get(kafkapubsub.MetadataOffset)+"/"+msg.Metadata.Get(kgopubsub.MetadataDeliveryCount))
		if msg.UUID != id || string(msg.Payload) != "command" {
			t.Fatalf("got %q %q, want the command", msg.UUID, msg.Payload)
		}
		if msg.Metadata.Get(kafkapubsub.MetadataOffset) == "0" {
			msg.Nack() // fails on every delivery of the record
			continue
		}
		msg.Ack()
		cancel()
	}
	if ctx.Err() != context.Canceled {
		t.Fatalf("the command never came back after its last delivery failed (deliveries: offset/count %v)", seen)
	}
	if end := kafkatest.EndOffsets(t, topic, 1)[0]; end != 2 {
		t.Fatalf("the topic's end is %d, want 2: the record and one copy (deliveries %v)", end, seen)
	}
	// The copy's first delivery counts the record's two before it.
	if last := seen[len(seen)-1]; last != "1/3" {
		t.Fatalf("the copy was delivered as offset/count %s, want 1/3 (deliveries %v)", last, seen)
	}
	testenv.WaitFor(t, time.Minute, "the share group done with both", func() bool { done, _ := shareGroupDone(t, group, topic, 1); return done })
}

// Misconfigurations of a share group are refused when they are made.
func TestShareConfigRefusals(t *testing.T) {
	t.Parallel()
	base := kafkapubsub.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}, ConsumerGroup: "g"}
	for name, c := range map[string]kgopubsub.SubscriberConfig{
		"no group":    {SubscriberConfig: kafkapubsub.SubscriberConfig{Brokers: base.Brokers}},
		"key-ordered": {SubscriberConfig: func() kafkapubsub.SubscriberConfig { b := base; b.KeyOrdered = true; return b }()},
		"instance":    {SubscriberConfig: base, InstanceID: "pod-0"},
		"protocol":    {SubscriberConfig: base, GroupProtocol: kgopubsub.ProtocolConsumer},
	} {
		if _, err := kgopubsub.NewShareSubscriber(&c); err == nil {
			t.Errorf("%s: NewShareSubscriber accepted it", name)
		}
	}
	if _, err := kgopubsub.NewSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: base, GroupProtocol: kgopubsub.ProtocolShare}); err == nil ||
		!strings.Contains(err.Error(), "NewShareSubscriber") {
		t.Errorf("NewSubscriber with ProtocolShare: %v, want a pointer to NewShareSubscriber", err)
	}
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = worker.New(pool, &worker.Config{Scope: "s", Topic: "t", Brokers: base.Brokers, KeyOrdered: true, Transport: shareTransport,
		Handler: func(context.Context, pgx.Tx, *message.Message) ([]*message.Message, error) { return nil, nil }})
	if err == nil || !strings.Contains(err.Error(), "KeyOrdered") {
		t.Errorf("worker with KeyOrdered on a share group: %v, want it refused", err)
	}
	_, err = worker.New(pool, &worker.Config{Scope: "s", Topic: "t", Brokers: base.Brokers, MissingKey: consumer.Skip, Transport: shareTransport,
		Handler: func(context.Context, pgx.Tx, *message.Message) ([]*message.Message, error) { return nil, nil }})
	if err == nil || !strings.Contains(err.Error(), "MissingKey") {
		t.Errorf("worker with MissingKey Skip on a share group: %v, want it refused", err)
	}
}

// A command whose every delivery fails (a handler that hangs past the
// worker's Timeout, which is longer than the record's lock, so that the
// lock runs out each time) is dead-lettered once, after MaxAttempts
// failures, its copies' included, instead of going round the group for
// ever.
func TestShareFailingCommandDeadLettered(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	hang := func(ctx context.Context, _ pgx.Tx, _ *message.Message) ([]*message.Message, error) {
		handled.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	const maxAttempts = 4
	_, _, commands, dlq, group := oneShareWorker(t, shortLocks, func(c *worker.Config, _ string) {
		c.Handler, c.Timeout, c.MaxAttempts = hang, 1500*time.Millisecond, maxAttempts
	})
	publish(t, commands, message.NewMessage(uuid.NewString(), []byte("hangs")))
	testenv.WaitFor(t, 2*time.Minute, "the command dead-lettered", func() bool { return kafkatest.EndOffsets(t, dlq, 1)[0] >= 1 })
	dead := kafkatest.ReadAll(t, dlq, 1, 10*time.Second)
	if len(dead) != 1 || string(dead[0].Value) != "hangs" || !hasHeader(dead[0].Headers, middleware.ReasonForPoisonedKey, "attempts") {
		t.Fatalf("dead letters %v, want the command with its reason", dead)
	}
	testenv.WaitFor(t, time.Minute, "the share group done with it", func() bool { done, _ := shareGroupDone(t, group, commands, 1); return done })
	time.Sleep(2 * time.Second)
	if n, end := handled.Load(), kafkatest.EndOffsets(t, commands, 1)[0]; n != maxAttempts || end > maxAttempts/2+1 {
		t.Fatalf("handled %d times over %d records, want %d times (MaxAttempts) over at most %d (the record and its copies, one made before the last delivery)", n, end, maxAttempts, maxAttempts/2+1)
	}
	if d := kafkatest.EndOffsets(t, dlq, 1)[0]; d != 1 {
		t.Fatalf("%d dead letters, want 1", d)
	}
}

// A command dead-lettered, then published again under its own ID once the
// handler is fixed (docs/troubleshooting.md), is applied, by the member
// that dead-lettered it too: what a subscription remembers of its dead
// letters is the records, not the IDs.
func TestShareDeadLetterPublishedAgainApplied(t *testing.T) {
	t.Parallel()
	var fixed atomic.Bool
	db, applied, commands, dlq, group := oneShareWorker(t, nil, func(c *worker.Config, applied string) {
		c.Handler = func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			if !fixed.Load() {
				return nil, dedupe.Permanent(errors.New("the handler's bug"))
			}
			return nil, applyOnce(ctx, tx, applied, msg)
		}
	})
	cmd := message.NewMessage(uuid.NewString(), []byte("command"))
	publish(t, commands, cmd)
	testenv.WaitFor(t, time.Minute, "the command dead-lettered", func() bool { return kafkatest.EndOffsets(t, dlq, 1)[0] >= 1 })
	fixed.Store(true)
	publish(t, commands, message.NewMessage(cmd.UUID, cmd.Payload))
	waitAppliedOnce(t, db, applied, group, commands, 1, 1, time.Minute)
}

// With keys made of the records' coordinates (consumer.KeyFromOffset; so
// too MissingKey Derive), a record copied before its last delivery and
// applied on it is not applied again through its copy: the copy carries
// its original's coordinates.
func TestShareCopyKeyedByOffsetAppliedOnce(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	db, applied, commands, _, group := oneShareWorker(t, shortLocks, func(c *worker.Config, applied string) {
		c.KeyFunc, c.Timeout = consumer.KeyFromOffset, 1500*time.Millisecond
		c.Handler = func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			if calls.Add(1) == 1 {
				<-ctx.Done() // past the lock: the record comes back on its last delivery, copied
				return nil, ctx.Err()
			}
			return nil, applyOnce(ctx, tx, applied, msg)
		}
	})
	publish(t, commands, message.NewMessage(uuid.NewString(), []byte("command")))
	testenv.WaitFor(t, time.Minute, "the record copied", func() bool { return kafkatest.EndOffsets(t, commands, 1)[0] >= 2 })
	// Done with the group only once the copy, at offset 1, was acknowledged
	// too.
	waitAppliedOnce(t, db, applied, group, commands, 1, 1, time.Minute)
}

// shortLocks is a share group whose records are locked 1s and delivered
// twice at most.
var shortLocks = map[string]string{"share.record.lock.duration.ms": "1000", "share.delivery.count.limit": "2"}

// oneShareWorker runs a worker on a new share group set to conf (when not
// nil), consuming a new commands topic of one partition with a new
// dead-letter topic, in a new schema with the applied table; edit sets its
// handler (which counts in applied) and the rest. It returns the schema's
// database, the applied table, the topics and the group.
func oneShareWorker(t *testing.T, conf map[string]string, edit func(c *worker.Config, applied string)) (db *pgtest.DB, applied, commands, dlq, group string) {
	t.Helper()
	requireShareGroups(t)
	db = pgtest.New(t)
	commands, dlq, group = kafkatest.Topic(t, 1), kafkatest.Topic(t, 1), kafkatest.Name("sg")
	if conf != nil {
		setShareGroup(t, group, conf)
	}
	applied = appliedTable(t, db)
	shareWorkers(t, db, 1, func(int) *worker.Config {
		c := &worker.Config{Scope: "test", Schema: db.Schema, Brokers: kafkatest.Brokers(t), Topic: commands, Group: group, DeadLetterTopic: dlq,
			Tables: []string{"applied"}, Logger: quietLogger(), StartupBackoff: 200 * time.Millisecond}
		edit(c, applied)
		return c
	})
	return db, applied, commands, dlq, group
}

// A record whose handler takes longer than franz-go's default idle
// connection timeout (30s), within a longer lock, is accepted once: the
// member's connection, whose close would end its share session and release
// the records it holds, is not closed as idle meanwhile.
func TestShareLongHandlerAcceptedOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("holds a record for 35s")
	}
	topic, group, ch, _, _ := shareSubscription(t, map[string]string{"share.record.lock.duration.ms": "50000"}, 0)
	publish(t, topic, message.NewMessage(uuid.NewString(), []byte("slow")))
	msg := <-ch
	time.Sleep(35 * time.Second) // the handler's work
	msg.Ack()
	testenv.WaitFor(t, time.Minute, "the share group done with the record", func() bool { done, _ := shareGroupDone(t, group, topic, 1); return done })
	select {
	case again := <-ch:
		t.Fatalf("the record came back (delivery %s) though it was acked within its lock", again.Metadata.Get(kgopubsub.MetadataDeliveryCount))
	case <-time.After(2 * time.Second):
	}
}

// A copy goes to the partition of the record it copies even when the
// Options name another partitioner (one that sends everything to partition
// 0, here): a copy elsewhere would not be known as one.
func TestShareCopyOnItsRecordsPartition(t *testing.T) {
	t.Parallel()
	requireShareGroups(t)
	topic, group := kafkatest.Topic(t, 2), kafkatest.Name("sg")
	setShareGroup(t, group, shortLocks)
	toZero := kgo.BasicConsistentPartitioner(func(string) func(*kgo.Record, int) int {
		return func(*kgo.Record, int) int { return 0 }
	})
	sub, err := kgopubsub.NewShareSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
		Brokers: kafkatest.Brokers(t), ConsumerGroup: group, Logger: quietLogger(), NackBackoff: 300 * time.Millisecond},
		Options: []kgo.Opt{kgo.RecordPartitioner(toZero)}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(t)...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rec := &kgo.Record{Topic: topic, Partition: 1, Value: []byte("command"),
		Headers: []kgo.RecordHeader{{Key: kafkapubsub.UUIDHeader, Value: []byte(uuid.NewString())}}}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for msg := range ch {
		if subtest.PartitionOf(msg) == 1 && subtest.OffsetOf(msg) == 0 {
			msg.Nack() // fails on every delivery of the record: it is copied
			continue
		}
		msg.Ack()
		cancel()
	}
	if end := kafkatest.EndOffsets(t, topic, 2); end[0] != 0 || end[1] != 2 {
		t.Fatalf("end offsets %v, want the record and its copy on partition 1 only", end)
	}
}

// A kgo.ConnIdleTimeout in the Options that is not above the group's
// record lock is refused at Subscribe: franz-go would close the connection
// of a member whose handler runs longer, which ends its share session, and
// the broker would release the records it holds. A group whose lock was
// never set is judged by the broker's default.
func TestShareConnIdleBelowLockRefused(t *testing.T) {
	t.Parallel()
	requireShareGroups(t)
	set, unset := kafkatest.Name("sg"), kafkatest.Name("sg")
	setShareGroup(t, set, map[string]string{"share.record.lock.duration.ms": "15000"})
	topic := kafkatest.Topic(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		group string
		idle  time.Duration
		ok    bool
	}{
		{set, 10 * time.Second, false}, {set, 15 * time.Second, false}, {set, 20 * time.Second, true},
		{unset, 2 * time.Second, false},
	} {
		sub, err := kgopubsub.NewShareSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
			Brokers: kafkatest.Brokers(t), ConsumerGroup: c.group, Logger: quietLogger()},
			Options: []kgo.Opt{kgo.ConnIdleTimeout(c.idle)}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = sub.Subscribe(ctx, topic)
		_ = sub.Close()
		if (err == nil) != c.ok || err != nil && !strings.Contains(err.Error(), "ConnIdleTimeout") {
			t.Errorf("ConnIdleTimeout %v on group %s: Subscribe: %v, want accepted %v", c.idle, c.group, err, c.ok)
		}
	}
}
