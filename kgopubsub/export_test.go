package kgopubsub

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// AlterGroupConfig sets the configurations set of the share group, as a
// ShareSubscriber sets those it owns.
func AlterGroupConfig(ctx context.Context, cl *kgo.Client, group string, set map[string]string) error {
	return alterGroupConfig(ctx, cl, group, set)
}

// GroupGeneration returns the generation (or, under ProtocolConsumer, the
// member epoch) and member ID of s's member of the group for topic, as
// franz-go holds them; ok is false before the member's client exists.
func GroupGeneration(s *Subscriber, topic string) (memberID string, generation int32, ok bool) {
	s.mu.Lock()
	m := s.members[topic]
	s.mu.Unlock()
	if m == nil {
		return "", 0, false
	}
	m.mu.Lock()
	cl := m.cl
	m.mu.Unlock()
	if cl == nil {
		return "", 0, false
	}
	memberID, generation = cl.GroupMetadata()
	return memberID, generation, true
}

// OriginAt names the record at offset of topic's partition, as a copy's
// origin header does.
func OriginAt(topic string, partition int32, offset int64) string {
	return originAt(&kgo.Record{Topic: topic, Partition: partition}, offset)
}
