// Package kafkapubsub is a Watermill Pub/Sub on segmentio/kafka-go: a
// consumer-group Subscriber that reads committed data and a Publisher, made
// to run under the effectively-once middleware of package
// [github.com/exactly-go/exactly/consumer] (and usable without it). It is
// the only package of the library that imports kafka-go.
//
//	sub, _ := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: "ledger"})
//	pub, _ := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers})
//	if err := kafkapubsub.CheckTopics(ctx, brokers, kafkapubsub.Security{}, "ledger.dlq"); err != nil { … }
//
// Each delivered message carries its Kafka coordinates twice: typed in its
// context, for the middleware and handlers ([dedupe.SourceFromContext]), and
// as strings in its metadata (MetadataTopic, MetadataPartition,
// MetadataOffset, MetadataKafkaKey, MetadataTimestamp), which survive a copy
// to a dead-letter topic. The Publisher writes every other metadata entry as
// a Kafka header, and the Watermill UUID as the header UUIDHeader, as
// watermill-kafka does.
//
// # Transactional producers
//
// The Subscriber reads committed data by default
// (SubscriberConfig.Isolation = ReadCommitted), as the Java consumer with
// isolation.level=read_committed does: records of aborted transactions and
// the transaction markers (control records) are never delivered, and nothing
// past a partition's last stable offset is, so a partition waits behind a
// transaction that is still open until it commits or aborts. The offsets of
// hidden records are committed all the same: a partition whose last record
// is a marker is not left lagging. kafka-go does not filter transactions, so
// the Subscriber sends its own Fetch requests over kafka-go's Transport and
// filters each response (by producer ID, with the response's list of aborted
// transactions), as the Java consumer's CompletedFetch does.
//
// ReadUncommitted delivers every data record as soon as it is written. A
// handler then applies records of transactions that are later aborted (work
// that upstream rolled back, which the dedupe store cannot undo: to it they
// are ordinary messages), and sees records of open transactions before they
// are decided. Choose it only when no producer of the topic uses
// transactions, or when the handler wants exactly that.
//
// A rebalance drains each revoked partition's in-flight message (up to
// DrainTimeout, which must be below RebalanceTimeout) while heartbeats go
// on, then commits and rejoins: a handler slower than SessionTimeout does
// not get its member expelled. A Subscriber started before its topic exists
// logs at WARN until the topic appears, then joins its group and consumes.
//
// The Publisher sends records over 1 MiB in batches of their own, so a
// record up to the topic's max.message.bytes (and MaxRecordBytes) can be
// published, and dead-lettered; a record refused for its size fails with
// ErrRecordTooLarge, naming the limit it hit.
//
// # Retention
//
// A key must outlive every way its message can come back. CheckTTL compares
// the store's TTL with the topic's retention.ms; call it at startup and
// warn (or refuse to start) when records outlive their keys.
package kafkapubsub
