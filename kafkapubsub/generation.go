package kafkapubsub

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"
)

// offsets holds each partition's next offset to commit, for one generation.
type offsets struct {
	mu      sync.Mutex
	pending map[int]int64
}

func (o *offsets) set(partition int, next int64) {
	o.mu.Lock()
	o.pending[partition] = next
	o.mu.Unlock()
}

func (o *offsets) take() map[int]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.pending) == 0 {
		return nil
	}
	p := o.pending
	o.pending = map[int]int64{}
	return p
}

func (o *offsets) putBack(p map[int]int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for part, off := range p {
		if cur, ok := o.pending[part]; !ok || off > cur {
			o.pending[part] = off
		}
	}
}

// runGeneration starts a reader per assigned partition and a committer, all
// bound to gen: when the generation ends they drain, commit and return.
func (s *Subscriber) runGeneration(ctx context.Context, gen *kafka.Generation, topic string, out chan<- *message.Message) {
	st := &offsets{pending: map[int]int64{}}
	assigned := gen.Assignments[topic]
	var sp *startPositions
	if s.cfg.Positions != nil {
		sp = newStartPositions(s, topic, assigned)
	}
	var commitMu sync.Mutex // one commit at a time, so saves and commits keep their order
	// Under commitMu: the least position the database must hold per
	// partition (loaded at the start, then each save), and whether it was
	// found holding less: then nothing more is saved or committed in this
	// generation, which ends (rewind) so that every partition starts again
	// from the database's positions.
	expected := map[int]int64{}
	fenced := false
	rewind := make(chan struct{})
	// Under commitMu: the partitions another member claimed since this
	// generation claimed them (PositionClaims) that Kafka says this
	// member lost: their offsets are neither saved nor committed again in
	// this generation, which Kafka ends once the member hears from it.
	lostParts := map[int]bool{}
	commit := func() {
		commitMu.Lock()
		defer commitMu.Unlock()
		if fenced {
			return
		}
		p := st.take()
		for part := range p {
			if lostParts[part] {
				delete(p, part)
			}
		}
		if len(p) == 0 {
			return
		}
		// The database's position first, then Kafka's: see savePositions.
		exp := map[int]int64{}
		for part := range p {
			if e, ok := expected[part]; ok {
				exp[part] = e
			}
		}
		behind, lost, err := s.savePositions(ctx, sp, p, exp)
		if err != nil {
			s.log().Warn("kafkapubsub: saving positions failed; not committing to Kafka either", "group", s.cfg.ConsumerGroup, "topic", topic, "generation", gen.ID, "offsets", p, "err", err)
			st.putBack(p)
			return
		}
		if len(behind) > 0 {
			fenced = true
			close(rewind)
			s.log().Warn("kafkapubsub: the database's positions went back while consuming (a failover or a restore lost commits); "+
				"starting the partitions again from the database's positions", "group", s.cfg.ConsumerGroup, "topic", topic,
				"generation", gen.ID, "db_positions", behind, "expected", exp)
			return
		}
		if len(lost) > 0 {
			lp := map[int]int64{}
			for _, part := range lost {
				lp[part] = p[part]
				delete(p, part)
			}
			s.reclaimLost(ctx, gen, sp, st, lp, lostParts)
			if len(p) == 0 {
				return
			}
		}
		for part, off := range p {
			expected[part] = off
		}
		if err := s.commitOffsets(ctx, gen, topic, p); err != nil {
			// The next owner re-reads from the last commit; the dedupe
			// middleware absorbs the redelivery.
			s.log().Warn("kafkapubsub: commit failed", "group", s.cfg.ConsumerGroup, "topic", topic, "generation", gen.ID, "offsets", p, "err", err)
			st.putBack(p)
		}
	}
	var partitions sync.WaitGroup
	s.log().Debug("kafkapubsub: generation started", "group", s.cfg.ConsumerGroup, "topic", topic, "generation", gen.ID, "partitions", len(assigned))
	for _, a := range assigned {
		partitions.Add(1)
		gen.Start(func(gctx context.Context) {
			defer partitions.Done()
			start := a.Offset
			if sp != nil {
				var dbOff int64
				var has, ok bool
				start, dbOff, has, ok = sp.start(gctx, a.ID, a.Offset)
				if !ok {
					return
				}
				if has {
					commitMu.Lock()
					if _, ok := expected[a.ID]; !ok {
						expected[a.ID] = dbOff
					}
					commitMu.Unlock()
				}
			}
			s.consumePartition(ctx, gctx, topic, a.ID, start, out, func(next int64) {
				st.set(a.ID, next)
				if s.cfg.CommitInterval < 0 {
					commit()
				}
			})
		})
	}
	// A function started on gen that returns ends the generation: this one
	// does on a rewind, and the others drain, then the group is joined
	// again.
	gen.Start(func(gctx context.Context) {
		select {
		case <-rewind:
		case <-gctx.Done():
		}
	})
	gen.Start(func(gctx context.Context) {
		defer func() {
			// The generation ended: keep the membership alive while the
			// partitions drain, so that a drain longer than SessionTimeout
			// does not get this member expelled and its last commit refused.
			stop := s.heartbeat(gen, topic)
			partitions.Wait()
			commit()
			stop()
		}()
		if s.cfg.CommitInterval > 0 {
			t := time.NewTicker(s.cfg.CommitInterval)
			defer t.Stop()
		loop:
			for {
				select {
				case <-t.C:
					commit()
				case <-gctx.Done():
					break loop
				}
			}
		} else {
			<-gctx.Done()
		}
	})
}
