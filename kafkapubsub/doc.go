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
// A rebalance drains each revoked partition's in-flight messages (up to
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
// # Concurrency within a partition
//
// By default a partition has one message in flight: the next is delivered
// after the previous one's ack. SubscriberConfig.MaxInFlight opens a window:
// up to that many messages of a partition are delivered without waiting for
// their acks, in offset order. Acks may come in any order; the committed
// offset is the contiguous acked watermark, the lowest offset not acked yet,
// so a slow or nacked message at a low offset holds the commit while the
// messages above it go on. A nacked message keeps its place and is
// delivered again with its offset after NackBackoff. The window holds at
// most 4 × MaxInFlight records from the watermark on (acked ones included):
// a message that stays unacked stops its partition once the window is full.
//
// With SubscriberConfig.KeyOrdered, at most one message per Kafka record key
// is in flight in a partition: a key's messages are handled one after the
// other in offset order (a nacked one is delivered again before the next of
// its key), while different keys run concurrently. A message whose key is
// busy waits in the window; messages of other keys behind it are delivered
// past it, so one slow key does not hold the others back until the window is
// full. All records with a null key count as one key (they run one at a
// time). A Watermill router handles each message of the channel in a
// goroutine of its own, so MaxInFlight: 64 with KeyOrdered runs up to 64
// handlers per partition at once. Without KeyOrdered the window is in plain
// offset order, for a consumer that reads the channel in one goroutine and
// acks in batches.
//
//	sub, _ := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
//		Brokers: brokers, ConsumerGroup: "ledger", MaxInFlight: 64, KeyOrdered: true,
//	})
//
// On a rebalance or Close every message of the window that is with a handler
// drains (up to DrainTimeout) and the watermark is committed. Messages not
// acked by then are delivered again by the partition's next owner, and so
// are the messages acked above the watermark: after a crash, everything
// from the last committed watermark comes back. Under the dedupe middleware
// of package consumer those that had completed are duplicates: their handler
// does not run again and their stored outputs are published again. Without
// it, handlers must tolerate them.
//
// # Retention
//
// A key must outlive every way its message can come back. CheckTTL compares
// the store's TTL with the topic's retention.ms; call it at startup and
// warn (or refuse to start) when records outlive their keys.
//
// # Positions kept with the data
//
// Kafka's committed offset passes a message only after its effects
// committed, but a database that later loses commits (an asynchronous
// standby promoted, a restore, a point-in-time recovery) keeps Kafka's
// offset ahead of what it holds. With SubscriberConfig.Positions (on
// Postgres, pgstore.Store.Positions) each commit saves the positions in the
// database first; a partition starts at the earlier of Kafka's offset and
// the database's, and a member whose database went back while it ran
// starts its partitions again from the database's positions:
//
//	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
//		Brokers: brokers, ConsumerGroup: "ledger", Positions: store.Positions(),
//	})
//
// See docs/deployments.md for what each deployment then promises.
package kafkapubsub
