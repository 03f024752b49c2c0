// Package mdkeys holds the Watermill metadata keys that more than one package
// of the library reads or writes, so that they are spelt once.
package mdkeys

// KafkaKey carries a message's Kafka record key: kafkapubsub's Subscriber
// sets it, its Publisher uses it as the record key, and the outbox orders
// and publishes by it.
const KafkaKey = "kafka_key"
