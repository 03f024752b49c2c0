package kgopubsub_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/mdkeys"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/kgopubsub"
	"github.com/exactly-go/exactly/worker"
)

// sharePoisonEnv carries, to a worker process TestSharePoisonKillingItsWorker
// starts, what it runs: "url|schema|table|brokers|topic|dlq|group".
const sharePoisonEnv = "KGOPUBSUB_SHARE_POISON_WORKER"

// A command whose handler kills its own process (an OOM), on a share group
// with a delivery limit of 3 and two supervised worker processes, is
// dead-lettered once its deliveries, by every member and its copies, pass
// twice MaxAttempts: it does not multiply without bound, copied at each
// death, and the other commands are applied once.
func TestSharePoisonKillingItsWorker(t *testing.T) {
	if spec := os.Getenv(sharePoisonEnv); spec != "" {
		runSharePoisonWorker(t, spec)
		return
	}
	t.Parallel()
	requireShareGroups(t)
	db := pgtest.New(t)
	commands, dlq := kafkatest.Topic(t, 1), kafkatest.Topic(t, 1)
	group := kafkatest.Name("sg")
	setShareGroup(t, group, map[string]string{"share.record.lock.duration.ms": "5000", "share.delivery.count.limit": "3"})
	applied := appliedTable(t, db)
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	spec := strings.Join([]string{url, db.Schema, applied, strings.Join(kafkatest.Brokers(t), ","), commands, dlq, group}, "|")
	// The workers' logs, shown if the test fails.
	var logs lockedBuffer
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestSharePoisonKillingItsWorker$")
		cmd.Env = append(os.Environ(), sharePoisonEnv+"="+spec)
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	// The supervisor: a worker that dies is started again.
	deaths := make(chan struct{}, 1000)
	stop := make(chan struct{})
	supervised := make(chan struct{})
	for range 2 {
		go func() {
			defer func() { supervised <- struct{}{} }()
			for {
				cmd := start()
				exited := make(chan struct{})
				go func() { _ = cmd.Wait(); close(exited) }()
				select {
				case <-exited:
					deaths <- struct{}{}
				case <-stop:
					_ = cmd.Process.Kill()
					<-exited
					return
				}
			}
		}()
	}
	defer func() {
		close(stop)
		<-supervised
		<-supervised
		if t.Failed() {
			t.Logf("the workers' logs:\n%s", logs.String())
		}
	}()

	const n = 10
	msgs := []*message.Message{message.NewMessage(uuid.NewString(), []byte("oom"))}
	for range n {
		msgs = append(msgs, message.NewMessage(uuid.NewString(), []byte("command")))
	}
	publish(t, commands, msgs...)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		done, _ := shareGroupDone(t, group, commands, 1)
		if kafkatest.EndOffsets(t, dlq, 1)[0] >= 1 && done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command that kills its worker was not dead-lettered in 3m: %d worker deaths, %d records on the topic for %d commands",
				len(deaths), kafkatest.EndOffsets(t, commands, 1)[0], n+1)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var once, twice int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE n > 1) FROM "+applied).
		Scan(&once, &twice); err != nil || once != n || twice != 0 {
		t.Fatalf("applied once %d, more than once %d (%v); want %d and 0", once, twice, err, n)
	}
	if d := kafkatest.EndOffsets(t, dlq, 1)[0]; d != 1 {
		t.Fatalf("%d dead letters, want 1", d)
	}
	// MaxAttempts 2 (a bound of 4 deliveries), a limit of 3: the command
	// that kills its worker and at most two copies of it (one per two
	// deaths). A copy whose acceptance came after its record's lock would
	// be made again on the next delivery: the lock (5s) is far above a
	// copy's round trip, even on a busy machine. Another command that a
	// dying worker held too is delivered again when its lock runs out, and
	// copied at its second delivery, as a record near its last delivery is:
	// at most once for each death.
	copies := map[string]int{}
	poison := ""
	for _, r := range kafkatest.ReadAll(t, commands, 1, 30*time.Second) {
		origin := ""
		for _, h := range r.Headers {
			if h.Key == mdkeys.ShareOrigin {
				origin = string(h.Value)
			}
		}
		if origin == "" {
			if string(r.Value) == "oom" {
				poison = kgopubsub.OriginAt(r.Topic, int32(r.Partition), r.Offset)
			}
			continue
		}
		copies[origin]++
	}
	if poison == "" {
		t.Fatal("the command that kills its worker is not on the topic")
	}
	for origin, c := range copies {
		if origin == poison && c > 2 || c > len(deaths) {
			t.Fatalf("%d copies of %s (the command that kills its worker: %s) after %d worker deaths: want at most 2 of it, and one a death of any other; all: %v",
				c, origin, poison, len(deaths), copies)
		}
	}
}

// runSharePoisonWorker is a worker process of
// TestSharePoisonKillingItsWorker: the "oom" command kills it.
func runSharePoisonWorker(t *testing.T, spec string) {
	f := strings.Split(spec, "|")
	url, schema, applied, brokers, topic, dlq, group := f[0], f[1], f[2], strings.Split(f[3], ","), f[4], f[5], f[6]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "oom" {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil, applyOnce(ctx, tx, applied, msg)
	}
	wk, err := worker.New(pool, &worker.Config{Scope: "test", Schema: schema, Brokers: brokers, Topic: topic, DeadLetterTopic: dlq, Group: group,
		Handler: apply, MaxAttempts: 2, Transport: shareTransport,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), StartupBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := wk.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// lockedBuffer is a bytes.Buffer that processes' outputs write to at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
