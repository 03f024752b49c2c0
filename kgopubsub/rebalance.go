package kgopubsub

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// assigned starts a goroutine per partition of the member's topic.
func (m *member) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.groupErr = nil // joined (franz-go calls it after every join, even with nothing new)
	for _, id := range assigned[m.topic] {
		if _, ok := m.parts[id]; ok {
			continue
		}
		p := newPartition(cl, m.topic, id, m.s.pauseAt())
		stopCtx, stop := context.WithCancel(context.WithoutCancel(m.subCtx))
		p.stop = stop
		m.parts[id] = p
		go consume(m.s.delivery(), m.subCtx, stopCtx, p, m.out, func(next int64) { m.acked(id, next) })
	}
	m.s.log().Debug("kgopubsub: partitions assigned", "group", m.s.cfg.ConsumerGroup, "topic", m.topic, "partitions", assigned[m.topic])
}

// acked records partition's watermark, to commit.
func (m *member) acked(partition int32, next int64) {
	m.mu.Lock()
	if _, ok := m.parts[partition]; ok {
		m.pending[partition] = next
	}
	m.mu.Unlock()
	if m.s.cfg.CommitInterval < 0 {
		m.commit(nil)
	}
}

// revoked drains the revoked partitions, commits what they acked and
// forgets them: the next owner starts at the commit.
func (m *member) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	m.stopPartitions(revoked[m.topic], true)
}

// lost drains the lost partitions and forgets them without committing: the
// membership that fetched them is gone, and so is the right to commit.
func (m *member) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	m.stopPartitions(lost[m.topic], false)
}

func (m *member) all() []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]int32, 0, len(m.parts))
	for id := range m.parts {
		ids = append(ids, id)
	}
	return ids
}

func (m *member) stopPartitions(ids []int32, commit bool) {
	var ps []*partition
	m.mu.Lock()
	for _, id := range ids {
		if p, ok := m.parts[id]; ok {
			ps = append(ps, p)
		}
	}
	m.mu.Unlock()
	if len(ps) == 0 {
		return
	}
	for _, p := range ps {
		p.stop()
	}
	for _, p := range ps {
		<-p.done
	}
	if commit {
		m.commit(ids)
	}
	m.mu.Lock()
	for _, p := range ps {
		delete(m.parts, p.id)
		delete(m.pending, p.id)
	}
	m.mu.Unlock()
	m.commitMu.Lock()
	for _, p := range ps {
		delete(m.expected, p.id)
	}
	m.commitMu.Unlock()
	for _, p := range ps {
		p.resume()
	}
	m.s.log().Debug("kgopubsub: partitions given up", "group", m.s.cfg.ConsumerGroup, "topic", m.topic, "partitions", ids, "committed", commit)
}
