package kafkapubsub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// Positions keeps a consumer group's committed offsets in the database that
// holds the consumer's effects, so that a database which loses its last
// commits (an asynchronous standby promoted, a restore from a base backup,
// a point-in-time recovery) loses the positions past what it kept as well.
// On assignment the Subscriber starts each partition at the earlier of
// Kafka's committed offset and the stored position: the messages in
// between are delivered again, the dedupe keys that survived absorb those
// whose effects survived, and those whose effects were lost are applied
// again. A partition with no stored position whose Kafka commit was made
// with Positions (the database was restored to before the partition's
// first save) starts at the oldest record Kafka holds.
//
// pgstore.Positions implements it on Postgres; set it with
// SubscriberConfig.Positions. Implementations must be safe for concurrent
// use.
type Positions interface {
	// Load returns the stored position (the next offset to consume) of each
	// of partitions that has one; a partition with none is absent from the
	// map.
	Load(ctx context.Context, group, topic string, partitions []int) (map[int]int64, error)
	// Save stores offsets (partition → next offset to consume) in one
	// durable write. The Subscriber calls it only with watermarks whose
	// messages were all acked, that is whose effects committed, and before
	// it commits the same offsets to Kafka.
	//
	// expected holds, for partitions whose position the Subscriber knows
	// (it loaded or saved it), the least position the database must still
	// hold. When it holds less for one of them, or no row, the database
	// went back in time while the Subscriber ran (a failover, a restore):
	// Save then stores nothing and returns what it holds for those
	// partitions (-1 for no row), and the Subscriber starts its partitions
	// again from the database's positions.
	//
	// The Subscriber always passes a non-nil expected; Save then never
	// moves a stored position backwards: a partition whose stored position
	// is past the offset keeps it (a member that lost the partition
	// without knowing it saves late, after the new owner saved further).
	Save(ctx context.Context, group, topic string, offsets, expected map[int]int64) (behind map[int]int64, err error)
}

// PositionClaims is implemented by Positions that know which member owns
// a partition (pgstore.Positions does): a Subscriber whose Positions have
// it claims its partitions at each assignment, instead of loading them, and
// fences each save with the claim, so that a member which lost a partition
// without knowing it yet (cut off from Kafka, or paused, past its
// session) saves nothing for it once its new owner claimed it. A save
// refused so makes the member ask Kafka, by committing the partition's
// offset, which only its owner may: refused, the member saves and commits
// nothing more for it until it is assigned it again; accepted, the other
// claim was stale (a member that left, whose claim reached the database
// late), and the member claims the partition again and saves on.
type PositionClaims interface {
	// Claim takes partitions for the caller and returns their stored
	// positions, as Load does, and the epoch of each claim: every claim
	// raises a partition's epoch.
	Claim(ctx context.Context, group, topic string, partitions []int) (positions, epochs map[int]int64, err error)
	// SaveClaimed is Save fenced by epochs (partition → the epoch the
	// caller claimed it with): a partition claimed since by another stores
	// nothing and is returned in lost.
	SaveClaimed(ctx context.Context, group, topic string, offsets, expected, epochs map[int]int64) (behind map[int]int64, lost []int, err error)
}

// positionTimeout bounds one Load or Save.
const positionTimeout = 10 * time.Second

// positionsMarker is the metadata of every offset that a Subscriber with
// Positions commits to Kafka. A partition whose Kafka commit carries it
// had a position saved in the database before that commit (the save comes
// first); with no row in the database now, the database went back to
// before the partition's first save (a restore, a failover to a standby
// that had not received it), and what it lost lies anywhere below Kafka's
// offset.
const positionsMarker = "exactly:positions:v1"

// commitOffsets commits p to Kafka for gen. With Positions each offset
// carries positionsMarker.
func (s *Subscriber) commitOffsets(ctx context.Context, gen *kafka.Generation, topic string, p map[int]int64) error {
	if s.cfg.Positions == nil {
		return gen.CommitOffsets(map[string]map[int]int64{topic: p})
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), positionTimeout)
	defer cancel()
	commits := make([]kafka.OffsetCommit, 0, len(p))
	for part, off := range p {
		commits = append(commits, kafka.OffsetCommit{Partition: part, Offset: off, Metadata: positionsMarker})
	}
	res, err := s.client(topic).OffsetCommit(ctx, &kafka.OffsetCommitRequest{
		GroupID: gen.GroupID, GenerationID: int(gen.ID), MemberID: gen.MemberID,
		Topics: map[string][]kafka.OffsetCommit{topic: commits},
	})
	if err != nil {
		return fmt.Errorf("commit offsets: %w", err)
	}
	for _, r := range res.Topics[topic] {
		if r.Error != nil {
			return fmt.Errorf("commit offset of partition %d: %w", r.Partition, r.Error)
		}
	}
	return nil
}

// markedPartitions returns the partitions of topic whose offset committed
// to Kafka carries positionsMarker.
func (s *Subscriber) markedPartitions(ctx context.Context, topic string, partitions []int) (map[int]bool, error) {
	res, err := s.client(topic).OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: s.cfg.ConsumerGroup, Topics: map[string][]int{topic: partitions}})
	if err != nil {
		return nil, fmt.Errorf("fetch committed offsets: %w", err)
	}
	if res.Error != nil {
		return nil, fmt.Errorf("fetch committed offsets: %w", res.Error)
	}
	out := map[int]bool{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("fetch committed offset of partition %d: %w", p.Partition, p.Error)
		}
		if p.CommittedOffset >= 0 && p.Metadata == positionsMarker {
			out[p.Partition] = true
		}
	}
	return out, nil
}

func (s *Subscriber) client(topic string) *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Timeout: positionTimeout, Transport: s.transport(topic)}
}

// savePositions stores p through the configured Positions, if any. The save
// comes before the Kafka commit of the same offsets: the database's
// position then never passes Kafka's in normal operation, so a database
// that lost commits shows as one whose position is behind Kafka's, and a
// failed save leaves Kafka's offset where it was.
//
// With PositionClaims the save is fenced by the epochs the generation
// claimed its partitions with (sp), and lost lists the partitions another
// member claimed since.
func (s *Subscriber) savePositions(ctx context.Context, sp *startPositions, p, expected map[int]int64) (behind map[int]int64, lost []int, err error) {
	if s.cfg.Positions == nil {
		return nil, nil, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), positionTimeout)
	defer cancel()
	if pc, ok := s.cfg.Positions.(PositionClaims); ok {
		behind, lost, err = pc.SaveClaimed(ctx, s.cfg.ConsumerGroup, sp.topic, p, expected, sp.claimed())
	} else {
		behind, err = s.cfg.Positions.Save(ctx, s.cfg.ConsumerGroup, sp.topic, p, expected)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("save positions: %w", err)
	}
	return behind, lost, nil
}

// reclaimLost decides about partitions whose save found them claimed by
// another member since this generation claimed them, lp holding the
// offsets that were not saved. Kafka knows who owns them: it accepts a
// commit of their offsets only from their owner in the group's current
// generation. If it refuses it for membership (this member was cut off or
// paused past its session and the group moved on), they are lost, added
// to lostParts: nothing more is saved or committed for them. If it accepts
// it, the claim that superseded this generation's was stale (a member that
// left, whose claim reached the database late): they are claimed again
// and their offsets saved at the next commit. Any other failure leaves
// their offsets pending, and the next commit decides again.
func (s *Subscriber) reclaimLost(ctx context.Context, gen *kafka.Generation, sp *startPositions, st *offsets, lp map[int]int64, lostParts map[int]bool) {
	attrs := []any{"group", s.cfg.ConsumerGroup, "topic", sp.topic, "generation", gen.ID, "offsets", lp}
	err := s.commitOffsets(ctx, gen, sp.topic, lp)
	switch {
	case errors.Is(err, kafka.UnknownMemberId), errors.Is(err, kafka.IllegalGeneration), errors.Is(err, kafka.RebalanceInProgress),
		errors.Is(err, kafka.FencedInstanceID):
		s.log().Warn("kafkapubsub: another member claimed partitions of this generation, and Kafka says this member lost them "+
			"(cut off from Kafka or paused past its session): their positions are not saved or committed", append(attrs, "err", err)...)
		for part := range lp {
			lostParts[part] = true
		}
		return
	case err != nil:
		s.log().Warn("kafkapubsub: another member claimed partitions of this generation, and asking Kafka who owns them failed; the next commit asks again",
			append(attrs, "err", err)...)
		st.putBack(lp)
		return
	}
	parts := slices.Sorted(maps.Keys(lp))
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), positionTimeout)
	defer cancel()
	_, epochs, err := s.cfg.Positions.(PositionClaims).Claim(cctx, s.cfg.ConsumerGroup, sp.topic, parts)
	if err != nil {
		s.log().Warn("kafkapubsub: claiming partitions again failed; the next commit tries again", append(attrs, "err", err)...)
	} else {
		sp.mu.Lock()
		if sp.epochs == nil {
			sp.epochs = map[int]int64{}
		}
		maps.Copy(sp.epochs, epochs)
		sp.mu.Unlock()
		s.log().Warn("kafkapubsub: a claim of this generation's partitions by another member was stale (Kafka says they are this member's): claimed them again",
			attrs...)
	}
	st.putBack(lp)
}

// startPositions loads the database's positions for a generation's
// partitions once, on the first partition's demand, retrying until it
// succeeds or the generation ends: a partition never starts without them.
type startPositions struct {
	s          *Subscriber
	topic      string
	partitions []int
	sem        chan struct{} // held while loading
	loaded     bool
	pos        map[int]int64
	marked     map[int]bool // Kafka's commit carries positionsMarker

	mu     sync.Mutex
	epochs map[int]int64 // the claims' epochs, with PositionClaims
}

// claimed returns the epochs of the generation's claims (nil before they
// are made, or without PositionClaims).
func (sp *startPositions) claimed() map[int]int64 {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.epochs
}

func newStartPositions(s *Subscriber, topic string, assigned []kafka.PartitionAssignment) *startPositions {
	sp := &startPositions{s: s, topic: topic, sem: make(chan struct{}, 1)}
	for _, a := range assigned {
		sp.partitions = append(sp.partitions, a.ID)
	}
	slices.Sort(sp.partitions)
	return sp
}

// get returns the stored positions; ok is false when ctx ended first.
func (sp *startPositions) get(ctx context.Context) (map[int]int64, bool) {
	select {
	case sp.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, false
	}
	defer func() { <-sp.sem }()
	if sp.loaded {
		return sp.pos, true
	}
	s := sp.s
	for bo := retryBackoff(); ; {
		lctx, cancel := context.WithTimeout(ctx, positionTimeout)
		var pos, epochs map[int]int64
		var err error
		if pc, ok := s.cfg.Positions.(PositionClaims); ok {
			pos, epochs, err = pc.Claim(lctx, s.cfg.ConsumerGroup, sp.topic, sp.partitions)
		} else {
			pos, err = s.cfg.Positions.Load(lctx, s.cfg.ConsumerGroup, sp.topic, sp.partitions)
		}
		if epochs != nil {
			sp.mu.Lock()
			sp.epochs = epochs
			sp.mu.Unlock()
		}
		var marked map[int]bool
		if err == nil {
			marked, err = s.markedPartitions(lctx, sp.topic, sp.partitions)
		}
		cancel()
		if err == nil {
			sp.pos, sp.marked, sp.loaded = pos, marked, true
			return pos, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		pause := bo.Next()
		s.log().Warn("kafkapubsub: cannot load the database's positions; the partitions wait for them", "group", s.cfg.ConsumerGroup, "topic", sp.topic, "err", err, "retry", pause)
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return nil, false
		}
	}
}

// start decides where partition starts, given Kafka's committed offset
// kafkaOff, and reports it; dbOff and has are the database's position. ok
// is false when ctx ended first.
//
// A partition with no position in the database whose Kafka commit carries
// positionsMarker starts at the oldest record Kafka holds: the database
// was restored to before the partition's first save, and which records'
// effects it kept is not known, so every record still held is delivered
// again and the dedupe keys that survived absorb those whose effects did.
func (sp *startPositions) start(ctx context.Context, partition int, kafkaOff int64) (start, dbOff int64, has, ok bool) {
	pos, ok := sp.get(ctx)
	if !ok {
		return 0, 0, false, false
	}
	s := sp.s
	dbOff, has = pos[partition]
	if has || !sp.marked[partition] {
		s.reportStart(ctx, sp.topic, partition, kafkaOff, dbOff, has)
		start = startOffset(kafkaOff, dbOff, has)
		if has && start == dbOff && dbOff != kafkaOff {
			// A database position below the log's start (a restore older
			// than the topic's retention) starts at the oldest record Kafka
			// holds: a fetch out of range would start at StartOffset, and
			// StartLast would skip every record Kafka still holds.
			if first, found := s.firstOffset(ctx, sp.topic, partition); found && first > dbOff {
				if kafkaOff < 0 {
					s.log().Error("kafkapubsub: the database's position is below the oldest record Kafka holds: "+
						"the effects of offsets db_position to log_start-1, if the database lost them, cannot be applied again (topic retention shorter than the restore window); "+
						"starting at log_start", "group", s.cfg.ConsumerGroup, "topic", sp.topic, "partition", partition, "db_position", dbOff, "log_start", first)
				}
				start = first
			}
		}
		return start, dbOff, has, true
	}
	for bo := retryBackoff(); ; {
		first, found := s.firstOffset(ctx, sp.topic, partition)
		if found {
			attrs := []any{"group", s.cfg.ConsumerGroup, "topic", sp.topic, "partition", partition, "kafka_offset", kafkaOff, "log_start", first}
			if first > 0 {
				s.log().Error("kafkapubsub: the database has no position for a partition whose Kafka commits were made with positions: "+
					"it was restored to before the partition's first position; delivering again from the oldest record Kafka holds, "+
					"but Kafka no longer holds offsets 0 to log_start-1: their effects, if the database lost them, cannot be applied again", attrs...)
			} else {
				s.log().Warn("kafkapubsub: the database has no position for a partition whose Kafka commits were made with positions: "+
					"it was restored to before the partition's first position; delivering again from the oldest record: "+
					"keys absorb what survived, the rest is applied again", attrs...)
			}
			return first, 0, false, true
		}
		pause := bo.Next()
		s.log().Warn("kafkapubsub: cannot read the oldest offset of a partition restored to before its first position; it waits", "group", s.cfg.ConsumerGroup, "topic", sp.topic, "partition", partition, "retry", pause)
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return 0, 0, false, false
		}
	}
}

// startOffset decides where an assigned partition starts: at the earlier of
// Kafka's committed offset (kafkaOff, negative when the group has none) and
// the database's position (dbOff, when has). With no Kafka offset the
// database's position is used: starting at StartFirst would deliver again
// messages whose keys may have expired, and StartLast would skip.
func startOffset(kafkaOff, dbOff int64, has bool) int64 {
	switch {
	case !has:
		return kafkaOff
	case kafkaOff < 0 || dbOff < kafkaOff:
		return dbOff
	default:
		return kafkaOff
	}
}

// reportStart logs where a partition starts when the database's position
// and Kafka's committed offset disagree. A database behind Kafka lost
// commits (or was restored): what lies between is delivered again, which
// is said at WARN, with whether Kafka still holds it.
func (s *Subscriber) reportStart(ctx context.Context, topic string, partition int, kafkaOff, dbOff int64, has bool) {
	attrs := []any{"group", s.cfg.ConsumerGroup, "topic", topic, "partition", partition, "kafka_offset", kafkaOff, "db_position", dbOff}
	switch {
	case !has:
		if kafkaOff >= 0 {
			s.log().Info("kafkapubsub: no position in the database; starting at Kafka's committed offset", attrs...)
		}
	case kafkaOff < 0:
		s.log().Info("kafkapubsub: no committed offset in Kafka; starting at the database's position", attrs...)
	case dbOff < kafkaOff:
		attrs = append(attrs, "redelivered", kafkaOff-dbOff)
		first, ok := s.firstOffset(ctx, topic, partition)
		switch {
		case !ok:
		case first > dbOff:
			attrs = append(attrs, "log_start", first)
			s.log().Error("kafkapubsub: the database is behind Kafka's committed offset and Kafka no longer holds the records in between: "+
				"the effects of offsets db_position to log_start-1, if the database lost them, cannot be applied again "+
				"(topic retention shorter than the restore window)", attrs...)
			return
		}
		s.log().Warn("kafkapubsub: the database's position is behind Kafka's committed offset (the database lost commits or was restored); "+
			"delivering again from the database's position: keys absorb what survived, the rest is applied again", attrs...)
	case dbOff > kafkaOff:
		s.log().Debug("kafkapubsub: the database's position is ahead of Kafka's committed offset (a commit to Kafka did not happen); starting at Kafka's", attrs...)
	}
}

// firstOffset returns the oldest offset that partition still holds.
func (s *Subscriber) firstOffset(ctx context.Context, topic string, partition int) (int64, bool) {
	ctx, cancel := context.WithTimeout(ctx, positionTimeout)
	defer cancel()
	res, err := s.client(topic).ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {kafka.FirstOffsetOf(partition)}}})
	if err != nil {
		return 0, false
	}
	for _, p := range res.Topics[topic] {
		if p.Partition == partition && p.Error == nil {
			return p.FirstOffset, true
		}
	}
	return 0, false
}
