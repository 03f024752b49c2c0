package workertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// Command is a record for the commands topic.
type Command struct {
	// ID is the message ID, the idempotency key by default (header
	// _watermill_message_uuid, kafkapubsub.UUIDHeader). Empty sends a
	// record without one, which the worker dead-letters (MissingKey Reject).
	ID string
	// Key is the record's Kafka key: it picks the partition (murmur2, the
	// worker's default partitioner). Defaults to ID, so that a command's
	// copies follow it on its partition.
	Key string
	// Payload is the record's value.
	Payload string
	// Headers are added to the record's.
	Headers map[string]string
}

// Send produces cmds to the commands topic, in order, and returns once
// the broker has them all. A command sent twice is an exact duplicate, as
// a producer's retry leaves; the same ID with another payload is a reused
// key, which the worker dead-letters.
func (k *Kit) Send(cmds ...Command) {
	k.t.Helper()
	msgs := make([]kafka.Message, len(cmds))
	for i, c := range cmds {
		key := c.Key
		if key == "" {
			key = c.ID
		}
		m := kafka.Message{Value: []byte(c.Payload)}
		if key != "" {
			m.Key = []byte(key)
		}
		if c.ID != "" {
			m.Headers = append(m.Headers, kafka.Header{Key: kafkapubsub.UUIDHeader, Value: []byte(c.ID)})
		}
		for _, h := range sortedKeys(c.Headers) {
			m.Headers = append(m.Headers, kafka.Header{Key: h, Value: []byte(c.Headers[h])})
		}
		msgs[i] = m
	}
	w := &kafka.Writer{Addr: kafka.TCP(k.brokers...), Topic: k.cfg.Topic, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, MaxAttempts: 5}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Timeout)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		k.t.Fatalf("workertest: send %d command(s) to %s: %v", len(msgs), k.cfg.Topic, err)
	}
	k.mu.Lock()
	k.sent = append(k.sent, cmds...)
	k.mu.Unlock()
}

// Redeliver sends again the commands sent earlier with these IDs (each
// ID's first command), or every command sent so far when none is given,
// as an upstream that delivers at least once does later on: same ID, key,
// payload and headers, at the end of the topic.
func (k *Kit) Redeliver(ids ...string) {
	k.t.Helper()
	k.mu.Lock()
	var again []Command
	if len(ids) == 0 {
		again = slices.Clone(k.sent)
	}
	for _, id := range ids {
		i := slices.IndexFunc(k.sent, func(c Command) bool { return c.ID == id })
		if i < 0 {
			k.mu.Unlock()
			k.t.Fatalf("workertest: Redeliver(%q): no command with that ID was sent", id)
			return
		}
		again = append(again, k.sent[i])
	}
	k.mu.Unlock()
	k.Send(again...)
}

// Sent returns the commands sent so far, in order, redeliveries included.
func (k *Kit) Sent() []Command {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.sent)
}

// WaitCaughtUp waits until the running worker has applied every record on
// the commands topic and published every output: for each partition, the
// group's committed offset in Kafka and its position in Postgres
// (exactly_positions, when the worker keeps it) are at the partition's
// end, and no outbox row is pending. It fails the test after
// Config.Timeout, saying where each partition stands, or at once when the
// worker stopped before it caught up. With no worker running ([Kit.Stop]),
// it checks once: the state a stopped worker left must be caught up.
func (k *Kit) WaitCaughtUp() {
	k.t.Helper()
	deadline := time.Now().Add(k.cfg.Timeout)
	var last string
	for delay := backoff.New(5*time.Millisecond, 200*time.Millisecond); ; {
		k.mu.Lock()
		r, group := k.running, k.group
		k.mu.Unlock()
		behind, err := k.behind(group)
		if err == nil && behind == "" {
			return
		}
		if err != nil {
			behind = err.Error()
		}
		last = behind
		if r == nil {
			k.t.Fatalf("workertest: no worker runs (Start or Run one), and group %s is behind: %s", group, last)
			return
		}
		select {
		case <-r.done:
			k.t.Fatalf("workertest: the worker stopped before it caught up: %v", r.err)
			return
		default:
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("workertest: the worker (group %s) did not catch up within %v: %s", group, k.cfg.Timeout, last)
			return
		}
		time.Sleep(delay.Next())
	}
}

// behind says what the worker has not done yet ("" when it is caught up).
func (k *Kit) behind(group string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := k.client()
	n, err := partitions(ctx, c, k.cfg.Topic)
	if err != nil {
		return "", err
	}
	end, err := endOffsets(ctx, c, k.cfg.Topic, n)
	if err != nil {
		return "", err
	}
	committed, err := kafkaadmin.Committed(ctx, c, group, k.cfg.Topic, n)
	if err != nil {
		return "", err
	}
	positions := map[int]int64{}
	rows, err := k.pool.Query(ctx, "SELECT partition, next_offset FROM exactly_positions WHERE consumer_group = $1 AND topic = $2", group, k.cfg.Topic)
	if err != nil {
		return "", fmt.Errorf("read exactly_positions: %w", err)
	}
	for rows.Next() {
		var p int
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			rows.Close()
			return "", err
		}
		positions[p] = o
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", err
	}
	var lag []string
	for p := range n {
		pos, kept := positions[p]
		if end[p] > 0 && (committed[p] != end[p] || (kept && pos != end[p])) {
			s := fmt.Sprintf("partition %d: end %d, committed %d", p, end[p], committed[p])
			if kept {
				s += fmt.Sprintf(", position in Postgres %d", pos)
			}
			lag = append(lag, s)
		}
	}
	var pending int
	if err := k.pool.QueryRow(ctx, "SELECT count(*) FROM exactly_outbox WHERE status = 'PENDING'").Scan(&pending); err != nil {
		return "", fmt.Errorf("read exactly_outbox: %w", err)
	}
	if pending > 0 {
		lag = append(lag, fmt.Sprintf("%d output(s) pending in the outbox", pending))
	}
	return strings.Join(lag, "; "), nil
}

// Record is a record read from a topic.
type Record struct {
	// ID is the message ID (kafkapubsub.UUIDHeader); "" when it has none.
	ID        string
	Key       string
	Payload   string
	Partition int
	Offset    int64
	// Headers are the record's other headers (the last value of a
	// repeated name).
	Headers map[string]string
	// Reason is why a dead letter was dead-lettered (the header
	// "reason_poisoned"); "" on other topics.
	Reason string
}

// Outputs waits until the worker has caught up, then returns the records
// of the outputs topic: the handler's outputs, published by the outbox
// relay, in partition and offset order.
func (k *Kit) Outputs() []Record {
	k.t.Helper()
	k.WaitCaughtUp()
	return k.Read(k.cfg.OutputTopic)
}

// DeadLetters waits until the worker has caught up, then returns the
// records of the dead-letter topic, each with its Reason.
func (k *Kit) DeadLetters() []Record {
	k.t.Helper()
	k.WaitCaughtUp()
	return k.Read(k.cfg.DeadLetterTopic)
}

// Read returns every record of topic up to its end offsets now, in
// partition and offset order, without waiting for the worker: the
// commands topic, say, or a topic another part of the program writes.
func (k *Kit) Read(topic string) []Record {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Timeout)
	defer cancel()
	c := k.client()
	n, err := partitions(ctx, c, topic)
	if err != nil {
		k.t.Fatalf("workertest: read %s: %v", topic, err)
	}
	end, err := endOffsets(ctx, c, topic, n)
	if err != nil {
		k.t.Fatalf("workertest: read %s: %v", topic, err)
	}
	per := make([][]Record, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for p := range n {
		if end[p] == 0 {
			continue
		}
		wg.Go(func() {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
			defer r.Close()
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					errs[p] = fmt.Errorf("partition %d after %d records: %w", p, len(per[p]), err)
					return
				}
				rec := Record{Key: string(m.Key), Payload: string(m.Value), Partition: m.Partition, Offset: m.Offset, Headers: map[string]string{}}
				for _, h := range m.Headers {
					switch h.Key {
					case kafkapubsub.UUIDHeader:
						rec.ID = string(h.Value)
					case middleware.ReasonForPoisonedKey:
						rec.Reason = string(h.Value)
					default:
						rec.Headers[h.Key] = string(h.Value)
					}
				}
				per[p] = append(per[p], rec)
				if m.Offset+1 >= end[p] {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		k.t.Fatalf("workertest: read %s: %v", topic, err)
	}
	var out []Record
	for _, recs := range per {
		out = append(out, recs...)
	}
	return out
}

func (k *Kit) client() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(k.brokers...), Timeout: 10 * time.Second}
}

func partitions(ctx context.Context, c *kafka.Client, topic string) (int, error) {
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	for _, t := range md.Topics {
		if t.Name == topic && t.Error == nil && len(t.Partitions) > 0 {
			return len(t.Partitions), nil
		}
	}
	return 0, fmt.Errorf("topic %s not found", topic)
}

func endOffsets(ctx context.Context, c *kafka.Client, topic string, n int) (map[int]int64, error) {
	return kafkaadmin.EndOffsets(ctx, c, topic, n)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
