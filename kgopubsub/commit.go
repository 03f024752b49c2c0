package kgopubsub

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/kafkapubsub"
)

// commit commits the pending offsets of owned partitions: with Positions,
// the database's positions first, then Kafka's. A failed commit leaves
// them pending for the next, except those of mustCommit (partitions being
// revoked), which are reported and given up: their next owner starts at
// the last commit, and the dedupe store absorbs the redelivery.
func (m *member) commit(mustCommit []int32) {
	m.commitMu.Lock()
	defer m.commitMu.Unlock()
	if m.fenced {
		return
	}
	m.mu.Lock()
	p := m.pending
	m.pending = map[int32]int64{}
	m.mu.Unlock()
	for part := range p {
		if m.lostParts[part] {
			delete(p, part)
		}
	}
	if len(p) == 0 {
		return
	}
	s := m.s
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	putBack := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for part, off := range p {
			if _, owned := m.parts[part]; !owned {
				continue
			}
			if cur, ok := m.pending[part]; !ok || off > cur {
				m.pending[part] = off
			}
		}
	}
	if s.cfg.Positions != nil {
		offs, exp := map[int]int64{}, map[int]int64{}
		for part, off := range p {
			offs[int(part)] = off
			if e, ok := m.expected[part]; ok {
				exp[int(part)] = e
			}
		}
		var behind map[int]int64
		var lost []int
		var err error
		if pc, ok := s.cfg.Positions.(kafkapubsub.PositionClaims); ok {
			behind, lost, err = pc.SaveClaimed(ctx, s.cfg.ConsumerGroup, m.topic, offs, exp, m.epochs)
		} else {
			behind, err = s.cfg.Positions.Save(ctx, s.cfg.ConsumerGroup, m.topic, offs, exp)
		}
		if err != nil {
			s.log().Warn("kgopubsub: saving positions failed; not committing to Kafka either", "group", s.cfg.ConsumerGroup, "topic", m.topic, "offsets", p, "err", err)
			putBack()
			return
		}
		if len(behind) > 0 {
			m.fenced = true
			close(m.rewind)
			s.log().Warn("kgopubsub: the database's positions went back while consuming (a failover or a restore lost commits); "+
				"starting the partitions again from the database's positions", "group", s.cfg.ConsumerGroup, "topic", m.topic,
				"db_positions", behind, "expected", exp)
			return
		}
		if len(lost) > 0 {
			s.log().Warn("kgopubsub: another member claimed partitions this member consumes: it lost them without knowing it "+
				"(cut off from Kafka or paused past its session); their positions are not saved or committed",
				"group", s.cfg.ConsumerGroup, "topic", m.topic, "lost", lost, "offsets", p)
			if m.lostParts == nil {
				m.lostParts = map[int32]bool{}
			}
			for _, part := range lost {
				m.lostParts[int32(part)] = true
				delete(p, int32(part))
			}
			if len(p) == 0 {
				return
			}
		}
		for part, off := range p {
			m.expected[part] = off
		}
		ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
			marker := positionsMarker
			for i := range req.Topics {
				for j := range req.Topics[i].Partitions {
					req.Topics[i].Partitions[j].Metadata = &marker
				}
			}
			return nil
		})
	}
	offsets := make(map[int32]kgo.EpochOffset, len(p))
	for part, off := range p {
		offsets[part] = kgo.EpochOffset{Epoch: -1, Offset: off}
	}
	var cerr error
	m.cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{m.topic: offsets},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				cerr = err
				return
			}
			for _, t := range resp.Topics {
				for _, rp := range t.Partitions {
					if perr := kerrOf(rp.ErrorCode); perr != nil {
						cerr = errors.Join(cerr, fmt.Errorf("partition %d: %w", rp.Partition, perr))
					}
				}
			}
		})
	if cerr != nil {
		s.log().Warn("kgopubsub: commit failed", "group", s.cfg.ConsumerGroup, "topic", m.topic, "offsets", p, "revoking", mustCommit, "err", cerr)
		putBack()
	}
}
