package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/mdkeys"
	"github.com/exactly-go/exactly/internal/msgid"
	"github.com/exactly-go/exactly/internal/sqlident"
)

// KeyMetadata is the metadata field that carries a message's partition key
// (the Kafka record key), as the consumer package's Publisher reads it.
const KeyMetadata = mdkeys.KafkaKey

// Config names the outbox table.
type Config struct {
	// Schema holds the table. Defaults to the first schema of the
	// search_path set in the connection string (?search_path=ledger), else
	// "public", as migrations.Config.Schema does: the Relay's pool's, and
	// for a Writer the connection of each transaction it writes in.
	Schema string
	// Table is the outbox table. Defaults to "exactly_outbox".
	Table string
	// PartitionKeyFunc returns a message's partition key: messages with the
	// same key are published in the order they were written. Defaults to
	// the KeyMetadata field; no key means no order across messages.
	PartitionKeyFunc func(topic string, msg *message.Message) (string, error)
}

// withDefaults fills in the defaults; schema is Schema's.
func (c *Config) withDefaults(schema string) (Config, string, error) {
	var o Config
	if c != nil {
		o = *c
	}
	if o.Schema == "" {
		o.Schema = schema
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
	// follow: Config.Schema was empty, so each transaction's connection
	// names the schema; inserts caches the statement per schema.
	follow  bool
	inserts sync.Map // schema → insert statement
}

// NewWriter returns a Writer. cfg may be nil.
func NewWriter(cfg *Config) (*Writer, error) {
	c, table, err := cfg.withDefaults("public")
	if err != nil {
		return nil, err
	}
	return &Writer{cfg: c, insert: newQueries(table, "").insert, follow: cfg == nil || cfg.Schema == ""}, nil
}

// insertFor returns the insert statement for tx: Config.Schema's, or the
// schema that tx's connection's search_path names.
func (w *Writer) insertFor(tx pgx.Tx) (string, error) {
	if !w.follow {
		return w.insert, nil
	}
	var cc *pgx.ConnConfig
	if conn := tx.Conn(); conn != nil {
		cc = conn.Config()
	}
	schema := sqlident.DefaultSchema(cc)
	if q, ok := w.inserts.Load(schema); ok {
		return q.(string), nil
	}
	if err := sqlident.Check("outbox: the schema of the connection's search_path (Config.Schema is empty)", schema); err != nil {
		return "", err
	}
	q := newQueries(pgx.Identifier{schema, w.cfg.Table}.Sanitize(), "").insert
	w.inserts.Store(schema, q)
	return q, nil
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

// WriteTx stores msgs for topic in tx, in order, with one statement. A
// message with no UUID gets a new UUIDv7, written into the message. The
// outputs that consumer.Config.Outputs hands over already carry IDs
// derived from their command, which a re-application of the command
// gives again; a message a handler writes itself with no UUID gets a new
// one at each run.
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
	// JSON text: pgx sends a []byte as bytea when it takes the parameter's
	// type from the Go type (QueryExecMode exec, simple_protocol).
	mds := make([]string, len(msgs))
	payloads := make([][]byte, len(msgs))
	lanes := make([]int16, len(msgs))
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("outbox: message %d for %s is nil", i, topic)
		}
		if m.UUID == "" {
			// Consumers deduplicate by the UUID: a time-ordered one keeps
			// their key index cheap (docs/keys.md).
			m.UUID = msgid.New()
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
		b, err := json.Marshal(md)
		if err != nil {
			return fmt.Errorf("outbox: metadata of %s: %w", m.UUID, err)
		}
		mds[i] = string(b)
		uuids[i], payloads[i], lanes[i] = m.UUID, m.Payload, lane(k, m.UUID)
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
	}
	insert, err := w.insertFor(tx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, insert, topic, keys, uuids, mds, payloads, lanes); err != nil {
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
