// Package kgopubsub is a Watermill Pub/Sub on franz-go (github.com/twmb/franz-go,
// kgo), with the contract of package
// [github.com/exactly-go/exactly/kafkapubsub], in a module of its own:
// importers of the core module never compile franz-go.
//
//	sub, _ := kgopubsub.NewSubscriber(&kgopubsub.SubscriberConfig{
//		SubscriberConfig: kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: "ledger", Positions: store.Positions()},
//		InstanceID:       os.Getenv("POD_NAME"), // static membership, optional
//	})
//	pub, _ := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: kafkapubsub.PublisherConfig{Brokers: brokers}})
//
// The configurations embed kafkapubsub's, whose fields keep their meaning
// and defaults; [Transport] makes both from kafkapubsub's configurations.
//
// # What is the same as kafkapubsub
//
// Each assigned partition is delivered by a goroutine of its own, in offset
// order, through the same window: one message in flight by default,
// MaxInFlight opens a window, KeyOrdered keeps one message per record key in
// flight; a nacked message comes back with its offset after NackBackoff.
// The committed offset is the contiguous acked watermark. Records are read
// committed by default (franz-go filters aborted transactions). Messages
// carry the same metadata (kafkapubsub.MetadataTopic … MetadataTimestamp,
// the UUID in kafkapubsub.UUIDHeader) and their coordinates in their
// context for the dedupe middleware (dedupe.SourceFromContext). Positions
// (pgstore.Positions) are loaded before a partition starts (the earlier of
// Kafka's offset and the database's), saved before each Kafka commit with
// the same commit metadata, and a database found behind what was saved
// makes the member start its partitions again from it. Security's TLS and
// SASL (kafka-go's mechanisms: plain, scram) apply to franz-go's
// connections. The Publisher writes the same records, keys and headers, a
// dead letter as the record that arrived, and places a key on the partition
// kafkapubsub's Publisher picks with the same Partitioner.
//
// # What franz-go adds
//
// The group is cooperative-sticky: a rebalance revokes only the partitions
// that move, and the others go on delivering through it. A revoked
// partition stops, drains its in-flight messages (up to DrainTimeout),
// commits its watermark, and only then lets the rebalance go on; polls and
// rebalances exclude each other (franz-go's BlockRebalanceOnPoll), so
// records are handed only to partitions the member owns and a commit is
// made only by the member that fetched the records, before it gives the
// partition up. A partition lost (the member was expelled) commits
// nothing. SubscriberConfig.InstanceID makes the member static: a restart
// within SessionTimeout rebalances nothing. GroupProtocol ProtocolConsumer
// joins with KIP-848's broker-side protocol (Kafka 4.0 and later). The
// Publisher is franz-go's idempotent producer with acks=all: a retried
// produce is never appended twice.
//
// # What differs
//
// Each Subscribe is a group member of its own, as with kafkapubsub.
// Without a ConsumerGroup every partition is read from StartOffset and
// nothing is committed. A partition whose log ends with a transaction
// marker is committed up to the marker, not past it (franz-go does not
// hand the marker's offset on): its lag shows 1 until the next record.
// The Publisher batches up to franz-go's default batch size (about 1 MB),
// which also bounds one record; BatchSize does not apply. A Subscriber
// started before its topic exists waits for it without a WARN of its own.
//
// # Share groups (Kafka's queues)
//
// ShareSubscriber (NewShareSubscriber, or Transport with GroupProtocol
// ProtocolShare for the worker) consumes a share group (KIP-932, Kafka 4.2
// and later): the broker hands records out one by one to any member, each
// locked to that member until it is acknowledged or its lock times out.
// Copies of a command, held by two members at once, are the normal path
// there; the dedupe store makes each safe. Ack accepts a record, an Ack
// after a dead letter rejects it, a Nack hands it to the handler again
// while its lock lasts and then releases it. There is no per-key order
// (KeyOrdered is refused) and no committed offset (Positions is refused,
// and the worker keeps none). A record on one of its last two deliveries
// (share.delivery.count.limit) is first copied to the end of its
// partition, so that the broker's archive does not drop the command; the
// cases this does not cover are in ShareSubscriber's documentation.
package kgopubsub
