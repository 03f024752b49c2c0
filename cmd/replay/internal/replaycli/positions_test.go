package replaycli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// replay positions reports, per partition, Kafka's committed offset, the
// database's position and the gap, after the database lost commits.
func TestPositions(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions = 3
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	db := pgtest.New(t)
	url, _ := pgtest.URL()
	ctx := context.Background()
	var msgs []kafka.Message
	for i := range 30 {
		msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprint("k", i%7)), Value: []byte("v")})
	}
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	if err := wr.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	_ = wr.Close()
	end := kafkatest.EndOffsets(t, topic, partitions)

	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	positions := store.Positions()
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: positions,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range ch {
			m.Ack()
		}
	}()
	testenv.WaitFor(t, time.Minute, "the group to commit every record", func() bool {
		c := kafkatest.CommittedOffsets(t, group, topic, partitions)
		for p, o := range end {
			if c[p] != o {
				return false
			}
		}
		return true
	})
	_ = sub.Close()
	// The database lost its last commits on partition 0.
	lost := min(end[0], 4)
	if _, err := positions.Save(ctx, group, topic, map[int]int64{0: end[0] - lost}, nil); err != nil {
		t.Fatal(err)
	}

	args := []string{"positions", "--brokers", brokers[0], "--group", group, "--topic", topic, "--database-url", url, "--schema", db.Schema}
	code, out, errs := run(append(args, "--json")...)
	if code != replaycli.ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	var rep replaycli.PositionsReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out)
	}
	if rep.Behind != lost || len(rep.Partitions) != partitions {
		t.Fatalf("%d behind over %d partitions, want %d over %d\n%s", rep.Behind, len(rep.Partitions), lost, partitions, out)
	}
	for _, p := range rep.Partitions {
		wantDB, wantGap := end[p.Partition], int64(0)
		if p.Partition == 0 {
			wantDB, wantGap = end[0]-lost, lost
		}
		if p.Kafka != end[p.Partition] || p.Database != wantDB || p.Gap != wantGap || p.LogEnd != end[p.Partition] || p.Unrecoverable {
			t.Errorf("partition %d: %+v, want kafka %d, database %d, gap %d", p.Partition, p, end[p.Partition], wantDB, wantGap)
		}
	}
	if code, out, _ := run(args...); code != replaycli.ExitOK || !strings.Contains(out, fmt.Sprintf("the database is behind: %d record(s) delivered again", lost)) {
		t.Fatalf("text report: exit %d\n%s", code, out)
	}
	// A database without the table says what to do.
	empty := pgtest.NewEmpty(t)
	if code, _, errs := run("positions", "--brokers", brokers[0], "--group", group, "--topic", topic, "--database-url", url, "--schema", empty.Schema); code != replaycli.ExitDatabase || !strings.Contains(errs, "migrations.Migrate") {
		t.Fatalf("without the table: exit %d\n%s", code, errs)
	}
}
