package kgopubsub

import (
	"context"
	"maps"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// positionsMarker is the metadata of every offset that a Subscriber with
// Positions commits to Kafka, the same as kafkapubsub's: a partition whose
// Kafka commit carries it had a position saved in the database before that
// commit, so a database with no row for it was restored to before its first
// save.
const positionsMarker = "exactly:positions:v1"

// offsetsFetched keeps Kafka's committed offsets of the partitions being
// assigned, and which carry positionsMarker, for adjustOffsets.
func (m *member) offsetsFetched(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	committed, marked := map[int32]int64{}, map[int32]bool{}
	collect := func(topic string, ps []kmsg.OffsetFetchResponseTopicPartition) {
		if topic != m.topic {
			return
		}
		for _, p := range ps {
			committed[p.Partition] = p.Offset
			if p.Offset >= 0 && p.Metadata != nil && *p.Metadata == positionsMarker {
				marked[p.Partition] = true
			}
		}
	}
	for _, t := range resp.Topics {
		collect(t.Topic, t.Partitions)
	}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			ps := make([]kmsg.OffsetFetchResponseTopicPartition, 0, len(t.Partitions))
			for _, gp := range t.Partitions {
				ps = append(ps, kmsg.OffsetFetchResponseTopicPartition{Partition: gp.Partition, Offset: gp.Offset, Metadata: gp.Metadata})
			}
			collect(t.Topic, ps)
		}
	}
	m.commitMu.Lock()
	m.committed, m.marked = committed, marked
	m.commitMu.Unlock()
	return nil
}

// adjustOffsets starts each assigned partition at the earlier of Kafka's
// committed offset and the database's position, as kafkapubsub does; a
// partition with no position whose Kafka commit carries positionsMarker
// starts at the oldest record Kafka holds. It waits for the database
// (retrying) until ctx ends: a partition never starts without its
// position.
func (m *member) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	ps := offsets[m.topic]
	if len(ps) == 0 {
		return offsets, nil
	}
	s := m.s
	ids := make([]int, 0, len(ps))
	for id := range ps {
		ids = append(ids, int(id))
	}
	var pos, epochs map[int]int64
	pc, claims := s.cfg.Positions.(kafkapubsub.PositionClaims)
	for bo := backoff.New(100*time.Millisecond, 5*time.Second); ; {
		lctx, cancel := context.WithTimeout(ctx, commitTimeout)
		var err error
		if claims {
			pos, epochs, err = pc.Claim(lctx, s.cfg.ConsumerGroup, m.topic, ids)
		} else {
			pos, err = s.cfg.Positions.Load(lctx, s.cfg.ConsumerGroup, m.topic, ids)
		}
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s.log().Warn("kgopubsub: cannot load the database's positions; the partitions wait for them", "group", s.cfg.ConsumerGroup, "topic", m.topic, "err", err)
		if bo.Sleep(ctx) != nil {
			return nil, ctx.Err()
		}
	}
	m.commitMu.Lock()
	defer m.commitMu.Unlock()
	if epochs != nil {
		if m.epochs == nil {
			m.epochs = map[int]int64{}
		}
		maps.Copy(m.epochs, epochs)
		for id := range epochs {
			delete(m.lostParts, int32(id))
		}
	}
	var back []int32 // partitions that start at the database's position, behind Kafka's
	for id := range ps {
		if dbOff, has := pos[int(id)]; has {
			if kafkaOff, ok := m.committed[id]; !ok || kafkaOff < 0 || dbOff < kafkaOff {
				back = append(back, id)
			}
		}
	}
	logStart := m.logStart(ctx, back)
	for id := range ps {
		kafkaOff, ok := m.committed[id]
		if !ok {
			kafkaOff = -1
		}
		dbOff, has := pos[int(id)]
		attrs := []any{"group", s.cfg.ConsumerGroup, "topic", m.topic, "partition", id, "kafka_offset", kafkaOff, "db_position", dbOff}
		switch {
		case !has && m.marked[id]:
			s.log().Warn("kgopubsub: the database has no position for a partition whose Kafka commits were made with positions: "+
				"it was restored to before the partition's first position; delivering again from the oldest record", attrs...)
			ps[id] = kgo.NewOffset().AtStart()
		case !has:
		case (kafkaOff < 0 || dbOff < kafkaOff) && logStart[id] > dbOff:
			// Below the log's start (a restore older than the topic's
			// retention): at the oldest record Kafka holds, never at the
			// reset offset (StartLast would skip every record it holds).
			s.log().Error("kgopubsub: the database's position is below the oldest record Kafka holds: the effects of offsets db_position to log_start-1, "+
				"if the database lost them, cannot be applied again (topic retention shorter than the restore window); delivering again from log_start",
				append(attrs, "log_start", logStart[id])...)
			ps[id] = kgo.NewOffset().At(logStart[id])
			m.expected[id] = dbOff
		case kafkaOff < 0 || dbOff < kafkaOff:
			if kafkaOff >= 0 {
				s.log().Warn("kgopubsub: the database's position is behind Kafka's committed offset (the database lost commits or was restored); "+
					"delivering again from the database's position", attrs...)
			}
			ps[id] = kgo.NewOffset().At(dbOff)
			m.expected[id] = dbOff
		default:
			m.expected[id] = dbOff
		}
	}
	return offsets, nil
}

// logStart returns the oldest offset Kafka holds of each of partitions
// (those it could read; a partition it could not is absent, and starts at
// the database's position as before).
func (m *member) logStart(ctx context.Context, partitions []int32) map[int32]int64 {
	out := map[int32]int64{}
	m.mu.Lock()
	cl := m.cl
	m.mu.Unlock()
	if len(partitions) == 0 || cl == nil {
		return out
	}
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = m.topic
	for _, id := range partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = id, -2 // the earliest
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	for _, sh := range cl.RequestSharded(ctx, req) {
		resp, ok := sh.Resp.(*kmsg.ListOffsetsResponse)
		if sh.Err != nil || !ok {
			m.s.log().Warn("kgopubsub: cannot read the oldest offsets Kafka holds", "group", m.s.cfg.ConsumerGroup, "topic", m.topic, "err", sh.Err)
			continue
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if t.Topic == m.topic && p.ErrorCode == 0 && p.Offset >= 0 {
					out[p.Partition] = p.Offset
				}
			}
		}
	}
	return out
}
