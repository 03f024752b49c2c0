// Package mdkeys holds the Watermill metadata keys that more than one package
// of the library reads or writes, so that they are spelt once.
package mdkeys

// KafkaKey carries a message's Kafka record key: kafkapubsub's Subscriber
// sets it, its Publisher uses it as the record key, and the outbox orders
// and publishes by it.
const KafkaKey = "kafka_key"

// The headers of a share group's copy of a record (kgopubsub's
// ShareSubscriber): the count of the deliveries of the records it copies,
// and topic/partition/offset of the record first produced. Neither is
// message metadata: the Subscribers leave them out of it, and the
// Publishers never write them from it.
const (
	ShareDeliveries = "exactly_share_deliveries"
	ShareOrigin     = "exactly_share_origin"
)

// ShareHeader says whether k is one of a share copy's headers.
func ShareHeader(k string) bool { return k == ShareDeliveries || k == ShareOrigin }
