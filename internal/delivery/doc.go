// Package delivery is the transport-independent core of the Kafka
// subscribers (kafkapubsub on kafka-go, kgopubsub on franz-go): each
// assigned partition's records go through a window of up to MaxInFlight
// messages, in offset order (with KeyOrdered, one per key), whose
// watermark (the lowest record not acked) is the offset to commit.
// A transport feeds a partition's loop (Partition.Run) with its client's
// records and turns each into a Watermill message; the loop does the
// rest: the message's context (the record as it arrived, its coordinates
// for dedupe.SourceFromContext, cancelled once the message is acked or
// nacked), the window, the acks and nacks with their back-off, and the
// drain when the partition stops. Settings defaults and checks what both
// subscribers' configurations share; Arrived, AsArrived and Outgoing make
// the record a Publisher writes of a message, one a Subscriber delivered
// as the record it arrived as.
package delivery
