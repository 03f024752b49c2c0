package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/sqlident"
)

// KeyMetadata is the metadata field that carries a message's partition key
// (the Kafka record key), as the consumer package's Publisher reads it.
const KeyMetadata = "kafka_key"

// Config names the outbox table.
type Config struct {
	// Schema holds the table. Defaults to "public".
	Schema string
	// Table is the outbox table. Defaults to "exactly_outbox".
	Table string
	// PartitionKeyFunc returns a message's partition key: messages with the
	// same key are published in the order they were written. Defaults to
	// the KeyMetadata field; no key means no order across messages.
	PartitionKeyFunc func(topic string, msg *message.Message) (string, error)
}

func (c *Config) withDefaults() (Config, string, error) {
	var o Config
	if c != nil {
		o = *c
	}
	if o.Schema == "" {
		o.Schema = "public"
	}
	if o.Table == "" {
		o.Table = "exactly_outbox"
	}
	if o.PartitionKeyFunc == nil {
		o.PartitionKeyFunc = func(_ string, m *message.Message) (string, error) { return m.Metadata.Get(KeyMetadata), nil }
	}
	if err := sqlident.Check("outbox: Config.Schema", o.Schema); err != nil {
		return o, "", err
	}
	if err := sqlident.Check("outbox: Config.Table", o.Table); err != nil {
		return o, "", err
	}
	return o, pgx.Identifier{o.Schema, o.Table}.Sanitize(), nil
}

// Writer writes messages into the outbox in the caller's transaction: they
// are published after, and only if, that transaction commits.
type Writer struct {
	cfg    Config
	insert string
}

// NewWriter returns a Writer. cfg may be nil.
func NewWriter(cfg *Config) (*Writer, error) {
	c, table, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Writer{cfg: c, insert: newQueries(table, "").insert}, nil
}

func lane(key, uuid string) int16 {
	h := fnv.New32a()
	if key != "" {
		h.Write([]byte(key))
	} else {
		h.Write([]byte(uuid))
	}
	return int16(h.Sum32() % Lanes)
}

// WriteTx stores msgs for topic in tx, in order, with one statement.
func (w *Writer) WriteTx(ctx context.Context, tx pgx.Tx, topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if topic == "" {
		return errors.New("outbox: WriteTx: topic is empty")
	}
	if tx == nil {
		return errors.New("outbox: WriteTx: tx is nil")
	}
	keys := make([]*string, len(msgs))
	uuids := make([]string, len(msgs))
	mds := make([][]byte, len(msgs))
	payloads := make([][]byte, len(msgs))
	lanes := make([]int16, len(msgs))
	for i, m := range msgs {
		if m.UUID == "" {
			return fmt.Errorf("outbox: message %d for %s has no UUID: consumers deduplicate by it", i, topic)
		}
		k, err := w.cfg.PartitionKeyFunc(topic, m)
		if err != nil {
			return fmt.Errorf("outbox: partition key of %s: %w", m.UUID, err)
		}
		if k != "" {
			keys[i] = &k
		}
		md := m.Metadata
		if k != "" && md.Get(KeyMetadata) != k {
			md = make(message.Metadata, len(m.Metadata)+1)
			for mk, mv := range m.Metadata {
				md[mk] = mv
			}
			md[KeyMetadata] = k
		}
		if md == nil {
			md = message.Metadata{}
		}
		if mds[i], err = json.Marshal(md); err != nil {
			return fmt.Errorf("outbox: metadata of %s: %w", m.UUID, err)
		}
		uuids[i], payloads[i], lanes[i] = m.UUID, m.Payload, lane(k, m.UUID)
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
	}
	if _, err := tx.Exec(ctx, w.insert, topic, keys, uuids, mds, payloads, lanes); err != nil {
		return fmt.Errorf("outbox: write %d message(s) for %s: %w", len(msgs), topic, err)
	}
	return nil
}

// Outputs returns a writer of a handler's output messages to topic, for
// consumer.Config.Outputs: the outputs then leave through the outbox in the
// handler's transaction.
func (w *Writer) Outputs(topic string) *TopicWriter { return &TopicWriter{w: w, topic: topic} }

// TopicWriter writes a handler's outputs to one topic: a consumer.OutputsWriter.
type TopicWriter struct {
	w     *Writer
	topic string
}

// WriteOutputsTx implements consumer.OutputsWriter.
func (o *TopicWriter) WriteOutputsTx(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	return o.w.WriteTx(ctx, tx, o.topic, msgs...)
}
