package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// Config configures a Worker. Scope, Topic, one of Handler and
// BatchHandler, and Brokers (or a Subscriber and a Publisher) are required;
// everything else has a default.
type Config struct {
	// Scope names the handler in every key: a stable name, since keys must
	// survive deploys (consumer.Config.Scope). Required.
	Scope string
	// AcrossTopics lets Scope's keys span topics: a command whose key was
	// applied from another topic is a duplicate. Defaults to false: such a
	// command is held with an ERROR naming Scope (two workers that share a
	// Scope on different topics would skip each other's commands); see
	// consumer.Config.AcrossTopics for when to set it.
	AcrossTopics bool
	// Topic is the topic of the commands the handler applies. Required.
	Topic string
	// Handler applies one message in the worker's transaction and returns
	// its outputs, which go to OutputTopic through the outbox in that same
	// transaction (per-message mode). Set Handler or BatchHandler, not both.
	Handler consumer.TxHandlerFunc
	// BatchHandler applies a batch of messages set-based in one
	// transaction (batch mode: consumer.BatchConsumer). Set Handler or
	// BatchHandler, not both.
	BatchHandler consumer.BatchHandlerFunc
	// OutputTopic receives the handler's outputs, through the outbox: they
	// are published by the worker's relay after, and only if, the
	// handler's transaction commits. Defaults to "": a handler that returns
	// outputs then fails with an error wrapping dedupe.ErrMisconfigured
	// (retried, never dead-lettered, never dropped).
	OutputTopic string
	// DeadLetterTopic receives the messages that fail for good (key reused,
	// invalid key or payload, dedupe.Permanent errors, poison), with the
	// reason in metadata "reason_poisoned". Defaults to Topic + ".dlq".
	DeadLetterTopic string
	// Group is the Kafka consumer group. Defaults to Scope. The worker
	// records it for Scope and Topic at start (pgstore.Store.RegisterScope,
	// table exactly_scopes): a worker of another group with the same Scope
	// on the same Topic (two services that copied a configuration) would
	// skip every command the first group applied as a duplicate, so it is
	// refused at start, with the fix, unless TakeOver is set. Not recorded
	// with a Subscriber of your own, whose group the worker does not know.
	Group string
	// TakeOver lets Group take Scope's commands on Topic over from the
	// group recorded before (a renamed group; a rebuild, docs/rebuild.md):
	// the commands that group applied are skipped as duplicates, the rest
	// are applied by this one; logged at WARN. Stop the previous group's
	// workers first: they would refuse to start again, but the running
	// ones go on consuming. Defaults to false.
	TakeOver bool

	// Brokers to consume from and publish to. Required unless Subscriber
	// and Publisher are both set.
	Brokers []string
	// Security holds the Kafka connections' TLS and SASL settings.
	// Defaults to plain TCP.
	Security kafkapubsub.Security
	// Partitioner spreads outputs and dead letters over partitions by key;
	// match the topics' other producers. Defaults to murmur2.
	Partitioner kafkapubsub.Partitioner
	// Subscriber and Publisher replace the worker's kafkapubsub Subscriber
	// and Publisher with a Watermill Pub/Sub of your own. The worker closes
	// them when it stops. The Publisher carries dead letters and the
	// outbox relay's messages. Default to a kafkapubsub Subscriber (group
	// Group) and Publisher on Brokers.
	Subscriber message.Subscriber
	Publisher  message.Publisher
	// Transport is the Kafka client the worker's Subscriber and Publisher
	// are made with, from the configuration above. Defaults to kafkapubsub
	// (kafka-go). kgopubsub.Transport (module
	// github.com/exactly-go/exactly/kgopubsub) is franz-go's: rebalances
	// that stop only the partitions that move (cooperative-sticky, or
	// KIP-848), static members, and an idempotent producer for the relay
	// and the dead letters. Not with Subscriber or Publisher. With
	// kgopubsub.Transport{GroupProtocol: kgopubsub.ProtocolShare} the
	// commands are consumed from a share group (Kafka's queues, KIP-932):
	// Group is the share group, records come in no order (KeyOrdered is
	// refused), and there are no positions to keep (NoPositions is implied;
	// Offsets does not apply).
	Transport Transport
	// MaxInFlight and KeyOrdered open a window of several messages per
	// partition in per-message mode (kafkapubsub.SubscriberConfig); in
	// batch mode the window is BatchSize. Default to 1 and false.
	MaxInFlight int
	KeyOrdered  bool
	// NoPositions keeps the group's committed offsets in Kafka only.
	// Defaults to false: they are kept in Postgres too (pgstore.Positions,
	// written before each Kafka commit), and each partition starts from
	// the earlier of the two, so a database that loses its last commits
	// (an asynchronous standby promoted, a restore) gets the messages
	// behind them again instead of losing them. Only for the worker's own
	// Subscriber; see docs/deployments.md.
	NoPositions bool
	// SessionTimeout is how long the group waits for a silent member
	// before it hands the member's partitions to the others. Heartbeats go
	// out every tenth of it. Defaults to 10s.
	SessionTimeout time.Duration

	// CreateTopics creates Topic, OutputTopic and DeadLetterTopic at start
	// when they are missing, with TopicPartitions partitions (the
	// dead-letter topic with one) and ReplicationFactor replicas. Defaults
	// to false: the topics must exist, and the worker waits (reporting
	// them in Health) until they do.
	CreateTopics bool
	// TopicPartitions is the partition count of created topics. Defaults
	// to the broker's default.
	TopicPartitions int
	// ReplicationFactor of created topics. Defaults to the broker's default.
	ReplicationFactor int
	// Tables are the handler's own tables, checked at start with the
	// worker's (a worker whose schema lacks one waits, reporting it in
	// Health, until the migrations have run). Unqualified names are in
	// Schema. Defaults to none.
	Tables []string
	// Migrate runs exactly's migrations (migrations.Migrate) at start, for
	// a worker whose role may create tables. Defaults to false: the tables
	// are created by a migrator (see the migrations package).
	Migrate bool
	// Schema holds exactly's tables. Defaults to the first schema of the
	// pool's search_path, else "public" (as pgstore.Config.Schema).
	Schema string
	// KeyLayout is how the keys are kept (pgstore.Config.Layout):
	// pgstore.LayoutPartitioned, compact rows in day partitions that
	// clean-up drops whole once their keys expired, or
	// pgstore.LayoutSingleTable, one table, for a deployment that has not
	// switched yet (docs/keys.md, docs/upgrading.md). With
	// LayoutPartitioned the start-up check creates the first partitions
	// and the key clean-up (CleanupInterval) creates the next ones: both
	// run DDL, so the worker's role must own the tables (as for Migrate),
	// or clean-up must run in a process whose role does (the start is
	// refused otherwise, with the fix). Defaults to LayoutPartitioned.
	KeyLayout pgstore.Layout

	// KeyFunc, FingerprintFunc, MissingKey, TTL and MaxAttempts are the
	// middleware's (consumer.Config). Default to the message UUID, the
	// SHA-256 of the payload's bytes, Reject, the store's 7 days and 10.
	// MissingKey Skip is refused on a share group, which delivers records
	// again as its normal path.
	KeyFunc         consumer.KeyFunc
	FingerprintFunc dedupe.FingerprintFunc
	MissingKey      consumer.MissingKeyPolicy
	TTL             time.Duration
	MaxAttempts     int
	// LogDuplicates logs each duplicate at INFO. Defaults to false: at
	// DEBUG (a replay of a million records prints no million lines).
	LogDuplicates bool
	// Timeout bounds one attempt: claim, handler and commit; in batch mode,
	// one batch's (consumer.BatchConfig.Timeout: claims, handler and
	// commit) and each per-message attempt. A connection whose peer is
	// silently gone holds an unbounded call forever. An attempt cut while
	// its handler waited for the database (a lock, the disk) never counts
	// against its command; one cut while the handler ran the command's own
	// work counts towards MaxAttempts (the consumer package doc's "Poison
	// messages and outages"). Defaults to 30s; 20s on a share group, below
	// its record lock (share.record.lock.duration.ms, 30s by default).
	Timeout time.Duration

	// BatchSize bounds a batch's messages in batch mode. Defaults to 100.
	BatchSize int
	// BatchWait bounds how long a batch waits for more messages after its
	// first one. Defaults to 10ms.
	BatchWait time.Duration
	// BatchWorkers is how many batches run at once, each partition on one.
	// Defaults to 1.
	BatchWorkers int

	// NoRelay leaves the outbox to a relay that runs elsewhere (another
	// process with outbox.Relay). Defaults to false: the worker relays the
	// outbox while it runs, and flushes it when it stops; each of the
	// relay's database calls is bounded by outbox.RelayConfig's default
	// StatementTimeout (30s).
	NoRelay bool
	// RelayPollInterval is the relay's polling floor (outbox.RelayConfig).
	// Defaults to 200ms.
	RelayPollInterval time.Duration
	// CleanupInterval is how often expired keys are removed (one runner at
	// a time across workers). Negative leaves clean-up to another process.
	// While it runs here, Run refuses to start when the pool's role lacks
	// the clean-up's rights (pgstore.Store.CheckMaintenance: DELETE on the
	// keys, and for LayoutPartitioned the tables' ownership, for its DDL).
	// Defaults to 1m.
	CleanupInterval time.Duration
	// StartupBackoff is the longest wait between two attempts to reach
	// Postgres and Kafka at start. Defaults to 10s.
	StartupBackoff time.Duration
	// DrainTimeout bounds how long a stop waits for messages in flight,
	// and then for the final outbox flush. Defaults to 30s.
	DrainTimeout time.Duration

	// Hooks receives an Event per message (consumer.Hooks). When it also
	// implements outbox.Hooks (plugin/eprom does), it receives the relay's
	// events too. A Hooks that is also a Plugin (it implements one of the
	// Plugin interfaces, as plugin/eotel's Tracer and plugin/eprom's
	// Metrics do) is installed whole, as if it were listed first in
	// Plugins (once, if it is listed there too). Defaults to none.
	Hooks consumer.Hooks
	// OutboxHooks receives the relay's events. Defaults to Hooks when that
	// implements outbox.Hooks, else none.
	OutboxHooks outbox.Hooks
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Plugins extend the worker, each where it belongs (see Plugin):
	// Plugins: []worker.Plugin{eotel.New(nil), eprom.New(nil)} gives whole
	// traces and the dashboard's metrics. Defaults to none.
	Plugins []Plugin
}

// withDefaults returns a copy of cfg with its defaults filled in, or an
// error naming the first field that is wrong and how to fix it.
func withDefaults(cfg *Config) (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.Scope == "":
		return c, errors.New("worker: Config.Scope is empty: set it to the handler's stable name (it is part of every key)")
	case c.Topic == "":
		return c, errors.New("worker: Config.Topic is empty: set it to the topic of the commands")
	case c.Handler == nil && c.BatchHandler == nil:
		return c, errors.New("worker: no handler: set Config.Handler (one message per transaction) or Config.BatchHandler (batch mode)")
	case c.Handler != nil && c.BatchHandler != nil:
		return c, errors.New("worker: Config.Handler and Config.BatchHandler are both set: a worker runs one of them")
	case len(c.Brokers) == 0 && (c.Subscriber == nil || c.Publisher == nil):
		return c, errors.New("worker: Config.Brokers is empty: set the Kafka brokers (or both Config.Subscriber and Config.Publisher)")
	case c.Transport != nil && (c.Subscriber != nil || c.Publisher != nil):
		return c, errors.New("worker: Config.Transport is set with Config.Subscriber or Config.Publisher: a Pub/Sub of your own replaces the transport; set one or the other")
	case c.MaxInFlight < 0:
		return c, fmt.Errorf("worker: Config.MaxInFlight is %d: set it to 1 or more", c.MaxInFlight)
	case c.KeyOrdered && c.BatchHandler != nil:
		return c, errors.New("worker: Config.KeyOrdered is for Handler: a batch reads each partition in offset order")
	case c.KeyOrdered && sharedGroup(&c):
		return c, errors.New("worker: Config.KeyOrdered is set with a share group: a share group hands records out one by one to any member, so there is no per-key order to keep; leave it false")
	case c.MissingKey == consumer.Skip && sharedGroup(&c):
		return c, errors.New("worker: Config.MissingKey is Skip with a share group: a share group hands a record out again, and to several members at once, as its normal path, " +
			"and a message without a key would be applied each time; use Reject (the default) or Derive")
	case c.OutputTopic != "" && c.OutputTopic == c.Topic:
		return c, fmt.Errorf("worker: Config.OutputTopic is the commands topic %q: the worker would consume its own outputs", c.Topic)
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = c.Topic + ".dlq"
	}
	if c.DeadLetterTopic == c.Topic {
		return c, fmt.Errorf("worker: Config.DeadLetterTopic is the commands topic %q: dead letters would be consumed again", c.Topic)
	}
	if c.Group == "" {
		c.Group = c.Scope
	}
	if sharedGroup(&c) {
		// The broker keeps each record's state, not a committed offset:
		// there is no position to keep.
		c.NoPositions = true
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 1
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
		if sharedGroup(&c) {
			// Below a share group's default lock (30s): an Ack after the
			// lock ran out is refused, and the record delivered again.
			c.Timeout = 20 * time.Second
		}
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 100
	}
	if c.BatchWorkers <= 0 {
		c.BatchWorkers = 1
	}
	if c.RelayPollInterval <= 0 {
		c.RelayPollInterval = 200 * time.Millisecond
	}
	if c.CleanupInterval == 0 {
		c.CleanupInterval = time.Minute
	}
	if c.StartupBackoff <= 0 {
		c.StartupBackoff = 10 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	c = hooksAsPlugin(c)
	if c.OutboxHooks == nil {
		if h, ok := c.Hooks.(outbox.Hooks); ok {
			c.OutboxHooks = h
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return withPlugins(c), nil
}

// Transport is a Kafka client that the worker consumes and publishes
// with: it makes a Watermill Subscriber and Publisher from kafkapubsub's
// configurations, with their contract (per-partition order, commits only
// past acked messages and before a partition is revoked, read_committed,
// MaxInFlight and KeyOrdered, Positions, the partitioners).
type Transport interface {
	NewSubscriber(cfg *kafkapubsub.SubscriberConfig) (message.Subscriber, error)
	NewPublisher(cfg *kafkapubsub.PublisherConfig) (message.Publisher, error)
}

// sharedGroup says whether c's Subscriber consumes a share group
// (KIP-932), as a Transport or a Subscriber with a SharedGroup method
// returning true reports (kgopubsub.Transport with GroupProtocol
// ProtocolShare, kgopubsub.ShareSubscriber): records
// are handed out one by one, with no order and no committed offsets.
func sharedGroup(c *Config) bool {
	for _, v := range []any{c.Transport, c.Subscriber} {
		if s, ok := v.(interface{ SharedGroup() bool }); ok && s.SharedGroup() {
			return true
		}
	}
	return false
}

// kafkaGo is the default Transport: kafkapubsub, on kafka-go.
type kafkaGo struct{}

func (kafkaGo) NewSubscriber(cfg *kafkapubsub.SubscriberConfig) (message.Subscriber, error) {
	return kafkapubsub.NewSubscriber(cfg)
}

func (kafkaGo) NewPublisher(cfg *kafkapubsub.PublisherConfig) (message.Publisher, error) {
	return kafkapubsub.NewPublisher(cfg)
}
