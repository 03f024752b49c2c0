package kgopubsub

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/twmb/franz-go/pkg/kerr"
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
			lp := map[int32]int64{}
			for _, part := range lost {
				lp[int32(part)] = p[int32(part)]
				delete(p, int32(part))
			}
			m.reclaimLost(ctx, lp)
			if len(p) == 0 {
				return
			}
		}
		for part, off := range p {
			m.expected[part] = off
		}
	}
	if cerr := m.commitKafka(ctx, p); cerr != nil {
		s.log().Warn("kgopubsub: commit failed", "group", s.cfg.ConsumerGroup, "topic", m.topic, "offsets", p, "revoking", mustCommit, "err", cerr)
		putBack()
	}
}

// commitKafka commits p to Kafka, with positionsMarker when the Subscriber
// has Positions.
func (m *member) commitKafka(ctx context.Context, p map[int32]int64) error {
	if m.s.cfg.Positions != nil {
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
	return cerr
}

// reclaimLost decides, under commitMu, about partitions whose save found
// them claimed by another member since this member claimed them, lp
// holding the offsets that were not saved. Kafka knows who owns them: it
// accepts a commit of their offsets only from their owner. If it refuses
// it for membership (this member was cut off or paused past its session
// and the group moved on, or another process took its InstanceID), they
// are lost: nothing more is saved or committed for them until they are
// assigned to this member again. If it accepts it, the claim that
// superseded this member's was stale (a member that left, whose claim
// reached the database late): they are claimed again and their offsets
// saved at the next commit. Any other failure leaves their offsets
// pending, and the next commit decides again.
func (m *member) reclaimLost(ctx context.Context, lp map[int32]int64) {
	s := m.s
	attrs := []any{"group", s.cfg.ConsumerGroup, "topic", m.topic, "offsets", lp}
	putBack := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for part, off := range lp {
			if _, owned := m.parts[part]; !owned {
				continue
			}
			if cur, ok := m.pending[part]; !ok || off > cur {
				m.pending[part] = off
			}
		}
	}
	err := m.commitKafka(ctx, lp)
	switch {
	case errors.Is(err, kerr.UnknownMemberID), errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.RebalanceInProgress),
		errors.Is(err, kerr.FencedInstanceID), errors.Is(err, kerr.StaleMemberEpoch), errors.Is(err, kerr.FencedMemberEpoch):
		s.log().Warn("kgopubsub: another member claimed partitions this member consumes, and Kafka says this member lost them "+
			"(cut off from Kafka or paused past its session): their positions are not saved or committed", append(attrs, "err", err)...)
		if m.lostParts == nil {
			m.lostParts = map[int32]bool{}
		}
		for part := range lp {
			m.lostParts[part] = true
		}
		return
	case err != nil:
		s.log().Warn("kgopubsub: another member claimed partitions this member consumes, and asking Kafka who owns them failed; the next commit asks again",
			append(attrs, "err", err)...)
		putBack()
		return
	}
	parts := make([]int, 0, len(lp))
	for part := range lp {
		parts = append(parts, int(part))
	}
	_, epochs, err := s.cfg.Positions.(kafkapubsub.PositionClaims).Claim(ctx, s.cfg.ConsumerGroup, m.topic, parts)
	if err != nil {
		s.log().Warn("kgopubsub: claiming partitions again failed; the next commit tries again", append(attrs, "err", err)...)
	} else {
		if m.epochs == nil {
			m.epochs = map[int]int64{}
		}
		maps.Copy(m.epochs, epochs)
		s.log().Warn("kgopubsub: a claim of this member's partitions by another member was stale (Kafka says they are this member's): claimed them again",
			attrs...)
	}
	putBack()
}
