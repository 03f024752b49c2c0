package kgopubsub_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
	"github.com/exactly-go/exactly/worker"
)

// shareWorkerEnv carries, to a worker process the test starts, what it
// runs: "url|schema|table|brokers|topic|dlq|group|mode".
const shareWorkerEnv = "KGOPUBSUB_SHARE_WORKER"

// Workers on one share group killed with SIGKILL, again and again, while
// they hold records' locks (in the middle of a handler's transaction, with
// a record's lock of 1s and the group's delivery limit at 3, so that
// records reach their last two deliveries, which are copied): every
// command is applied exactly once, none is lost. Per-message and batch
// mode.
func TestShareKilledWorkers(t *testing.T) {
	if spec := os.Getenv(shareWorkerEnv); spec != "" {
		runShareWorkerProcess(t, spec)
		return
	}
	t.Parallel()
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testKilledShareWorkers(t, mode)
		})
	}
}

func testKilledShareWorkers(t *testing.T, mode string) {
	requireShareGroups(t)
	db := pgtest.New(t)
	commands, dlq := kafkatest.Topic(t, 3), kafkatest.Topic(t, 1)
	group := kafkatest.Name("sg")
	setShareGroup(t, group, map[string]string{"share.record.lock.duration.ms": "1000", "share.delivery.count.limit": "3",
		"share.session.timeout.ms": "6000", "share.heartbeat.interval.ms": "1000"})
	applied := appliedTable(t, db)
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	spec := strings.Join([]string{url, db.Schema, applied, strings.Join(kafkatest.Brokers(t), ","), commands, dlq, group, mode}, "|")
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestShareKilledWorkers$")
		cmd.Env = append(os.Environ(), shareWorkerEnv+"="+spec)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	workers := []*exec.Cmd{start(), start()}
	t.Cleanup(func() {
		for _, w := range workers {
			_ = w.Process.Kill()
			_ = w.Wait()
		}
	})

	const n = 300
	published := make(chan error, 1)
	go func() {
		pub, err := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: kafkapubsub.PublisherConfig{Brokers: kafkatest.Brokers(t)}})
		if err != nil {
			published <- err
			return
		}
		defer pub.Close()
		for i := range n {
			if err := pub.Publish(commands, message.NewMessage(uuid.NewString(), []byte(fmt.Sprint(i)))); err != nil {
				published <- err
				return
			}
			time.Sleep(15 * time.Millisecond)
		}
		published <- nil
	}()
	kills := 0
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); kills++ {
		time.Sleep(time.Duration(400+rand.IntN(800)) * time.Millisecond)
		i := rand.IntN(len(workers))
		_ = workers[i].Process.Signal(syscall.SIGKILL)
		_ = workers[i].Wait()
		workers[i] = start()
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	waitAppliedOnce(t, db, applied, group, commands, 3, n, 3*time.Minute)
	if d := kafkatest.EndOffsets(t, dlq, 1)[0]; d != 0 {
		t.Fatalf("%d dead letters, want none", d)
	}
	end := kafkatest.EndOffsets(t, commands, 3)
	t.Logf("%d kills; %d records for %d commands (copies of records near their last delivery)", kills, end[0]+end[1]+end[2], n)
}

// runShareWorkerProcess is a worker process of TestShareKilledWorkers: it
// runs until it is killed, or its parent ends it.
func runShareWorkerProcess(t *testing.T, spec string) {
	f := strings.Split(spec, "|")
	url, schema, applied, brokers, topic, dlq, group, mode := f[0], f[1], f[2], strings.Split(f[3], ","), f[4], f[5], f[6], f[7]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		if err := applyOnce(ctx, tx, applied, msg); err != nil {
			return nil, err
		}
		// Held in the open transaction: a kill lands here often.
		time.Sleep(time.Duration(20+rand.IntN(60)) * time.Millisecond)
		return nil, nil
	}
	cfg := &worker.Config{Scope: "test", Schema: schema, Brokers: brokers, Topic: topic, DeadLetterTopic: dlq, Group: group,
		Handler: apply, MaxInFlight: 4, Transport: shareTransport, Logger: quietLogger(), StartupBackoff: 200 * time.Millisecond}
	if mode == "batch" {
		cfg.Handler, cfg.BatchSize, cfg.MaxInFlight = nil, 10, 0
		cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
			for _, m := range msgs {
				if _, err := apply(ctx, tx, m); err != nil {
					return nil, err
				}
			}
			return make([][]*message.Message, len(msgs)), nil
		}
	}
	wk, err := worker.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := wk.Run(ctx); err != nil {
		t.Fatal(err)
	}
}
