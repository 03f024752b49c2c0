package kafkapubsub_test

import (
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// javaMurmur2 is org.apache.kafka.common.utils.Utils.murmur2, written from
// the Java source, independently of kafka-go's copy.
func javaMurmur2(data []byte) int32 {
	const seed, m, r = uint32(0x9747b28c), uint32(0x5bd1e995), 24
	n := len(data)
	h := seed ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[n&^3:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// The partition each client's default partitioner picks for a key, from
// the clients' sources: the Java producer (Utils.toPositive(murmur2) % n),
// sarama's NewHashPartitioner (int32(fnv1a) % n, negated when negative) and
// librdkafka's consistent_random (crc32 % n).
func javaPartition(key []byte, n int) int { return int(javaMurmur2(key)&0x7fffffff) % n }

func saramaPartition(key []byte, n int) int {
	h := fnv.New32a()
	h.Write(key)
	p := int32(h.Sum32()) % int32(n)
	if p < 0 {
		p = -p
	}
	return int(p)
}

func librdkafkaPartition(key []byte, n int) int { return int(crc32.ChecksumIEEE(key) % uint32(n)) }

// Kafka's own test vectors for murmur2 (UtilsTest.testMurmur2) pin the
// reference used below.
func TestJavaMurmur2Vectors(t *testing.T) {
	for in, want := range map[string]int32{
		"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
		"a-little-bit-longer-string": -1486304829, "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, "abc": 479470107,
	} {
		if got := javaMurmur2([]byte(in)); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", in, got, want)
		}
	}
}

// Each named partitioner puts every key where the client it names would:
// a Publisher sharing a topic with that client keeps each key on one
// partition.
func TestPartitionersMatchTheirClients(t *testing.T) {
	t.Parallel()
	const partitions, keys = 6, 100
	brokers := kafkatest.Brokers(t)
	ref := map[kafkapubsub.Partitioner]func([]byte, int) int{
		"":                             javaPartition,
		kafkapubsub.PartitionerMurmur2: javaPartition,
		kafkapubsub.PartitionerFNV1a:   saramaPartition,
		kafkapubsub.PartitionerCRC32:   librdkafkaPartition,
	}
	for p, want := range ref {
		topic := kafkatest.Topic(t, partitions)
		pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Partitioner: p,
			Compression: kafkapubsub.CompressionGzip, Acks: kafkapubsub.AcksLeader, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		msgs := make([]*message.Message, keys)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("u-%d", i), []byte("v"))
			msgs[i].Metadata.Set(kafkapubsub.MetadataKafkaKey, fmt.Sprintf("account-%d", i))
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			t.Fatal(err)
		}
		pub.Close()
		got := kafkatest.ReadAll(t, topic, partitions, time.Minute)
		if len(got) != keys {
			t.Fatalf("%q: read %d records, want %d", p, len(got), keys)
		}
		for _, r := range got {
			if w := want(r.Key, partitions); r.Partition != w {
				t.Errorf("partitioner %q: key %s on partition %d, its client puts it on %d", p, r.Key, r.Partition, w)
			}
		}
	}
	differ := 0
	for i := range keys {
		k := []byte(fmt.Sprintf("account-%d", i))
		if javaPartition(k, partitions) != saramaPartition(k, partitions) {
			differ++
		}
	}
	t.Logf("murmur2 and fnv1a disagree on %d of %d keys on %d partitions", differ, keys, partitions)
}

func TestPublisherConfigRejectsUnknownNames(t *testing.T) {
	for name, cfg := range map[string]kafkapubsub.PublisherConfig{
		"Partitioner": {Brokers: []string{"x"}, Partitioner: "murmur3"},
		"Compression": {Brokers: []string{"x"}, Compression: "brotli"},
		"Acks":        {Brokers: []string{"x"}, Acks: "none"},
	} {
		if _, err := kafkapubsub.NewPublisher(&cfg); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.Contains(err.Error(), "PublisherConfig."+name) {
			t.Errorf("%s: the error does not name the field: %v", name, err)
		}
	}
}
