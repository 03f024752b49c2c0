package kafkapubsub

import (
	"fmt"

	"github.com/segmentio/kafka-go"
)

// Partitioner names how the Publisher picks a keyed record's partition.
// Records of one key keep their order only while they share a partition, so
// when other producers write the same topic, pick the partitioner they use:
// the same key then lands on the same partition whoever writes it. Records
// without a key go to a random partition with every partitioner.
//
// On a 6-partition topic, two of the three place about 5 of 6 keys on
// different partitions, so a mismatch breaks per-key order for most keys.
type Partitioner string

const (
	// PartitionerMurmur2 is murmur2 of the key, positive, modulo the
	// partition count: the Java producer's default (and Kafka Streams',
	// Kafka Connect's, franz-go's), kafka-go's Murmur2Balancer. The default.
	PartitionerMurmur2 Partitioner = "murmur2"
	// PartitionerFNV1a is 32-bit FNV-1a of the key, as a signed integer
	// modulo the partition count, made positive: sarama's default
	// (NewHashPartitioner), and so watermill-kafka's, and kafka-go's Hash.
	PartitionerFNV1a Partitioner = "fnv1a"
	// PartitionerCRC32 is the IEEE CRC-32 of the key modulo the partition
	// count: librdkafka's default (consistent_random), and so that of
	// confluent-kafka-go, confluent-kafka-python and kcat.
	PartitionerCRC32 Partitioner = "crc32"
)

// Partitioners lists the partitioners by name.
var Partitioners = []Partitioner{PartitionerMurmur2, PartitionerFNV1a, PartitionerCRC32}

// ParsePartitioner returns the Partitioner named s ("" is the default,
// murmur2), or an error listing the names.
func ParsePartitioner(s string) (Partitioner, error) {
	if s == "" {
		return PartitionerMurmur2, nil
	}
	for _, p := range Partitioners {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("kafkapubsub: unknown partitioner %q: use murmur2 (Java, franz-go), fnv1a (sarama, watermill-kafka) or crc32 (librdkafka)", s)
}

func (p Partitioner) balancer() kafka.Balancer {
	switch p {
	case PartitionerFNV1a:
		return &kafka.Hash{}
	case PartitionerCRC32:
		return &kafka.CRC32Balancer{}
	default:
		return &kafka.Murmur2Balancer{}
	}
}

// Compression is the codec of the record batches the Publisher sends.
type Compression string

// The codecs Kafka knows. Consumers decompress whatever they get.
const (
	CompressionNone   Compression = "none"
	CompressionGzip   Compression = "gzip"
	CompressionSnappy Compression = "snappy"
	CompressionLz4    Compression = "lz4"
	CompressionZstd   Compression = "zstd"
)

func (c Compression) codec() (kafka.Compression, error) {
	switch c {
	case "", CompressionNone:
		return 0, nil
	case CompressionGzip:
		return kafka.Gzip, nil
	case CompressionSnappy:
		return kafka.Snappy, nil
	case CompressionLz4:
		return kafka.Lz4, nil
	case CompressionZstd:
		return kafka.Zstd, nil
	}
	return 0, fmt.Errorf("kafkapubsub: PublisherConfig.Compression %q: use none, gzip, snappy, lz4 or zstd", string(c))
}

// Acks is how many replicas must have a record before Publish returns.
type Acks string

const (
	// AcksAll waits for every in-sync replica: a published record survives
	// the loss of its leader. The default, and the only setting under which
	// the outbox's and the middleware's published outputs cannot be lost
	// once Publish returns.
	AcksAll Acks = "all"
	// AcksLeader waits for the partition leader alone: faster, but a record
	// acknowledged just before the leader fails can be lost, and the outbox
	// relay would have marked it published.
	AcksLeader Acks = "leader"
)

func (a Acks) required() (kafka.RequiredAcks, error) {
	switch a {
	case "", AcksAll:
		return kafka.RequireAll, nil
	case AcksLeader:
		return kafka.RequireOne, nil
	}
	return 0, fmt.Errorf("kafkapubsub: PublisherConfig.Acks %q: use all or leader", string(a))
}
