package replaycli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/kafkapubsub"
)

// RewindConfig configures Rewind.
type RewindConfig struct {
	Brokers []string
	// Security holds the TLS and SASL settings. Defaults to plain TCP.
	Security kafkapubsub.Security
	Group    string
	Topic    string
	// Exactly one of ToOffset (>= 0), ToTime or Back (> 0) says where to.
	ToOffset int64
	ToTime   time.Time
	Back     int64
	// Execute commits the plan; without it Rewind only shows it.
	Execute bool
}

// Move is one partition's planned offset change.
type Move struct {
	Partition int   `json:"partition"`
	Current   int64 `json:"current"`
	New       int64 `json:"new"`
}

// RewindPlan reports a rewind.
type RewindPlan struct {
	Group    string `json:"group"`
	Topic    string `json:"topic"`
	Moves    []Move `json:"moves"`
	Executed bool   `json:"executed"`
	// Redelivered counts the records the group will consume again.
	Redelivered int64 `json:"redelivered"`
}

// errGroupActive: the group has members; its offsets are theirs to commit.
var errGroupActive = fmt.Errorf("the consumer group has active members")

// Rewind resets a consumer group's committed offsets on a topic. It refuses
// while the group has active members, and changes nothing unless Execute.
func Rewind(ctx context.Context, o RewindConfig) (RewindPlan, error) {
	plan := RewindPlan{Group: o.Group, Topic: o.Topic}
	set := 0
	if o.ToOffset >= 0 {
		set++
	}
	if !o.ToTime.IsZero() {
		set++
	}
	if o.Back > 0 {
		set++
	}
	if set != 1 {
		return plan, fmt.Errorf("%w: give exactly one of --to-offset, --to-time, --back", errUsage)
	}
	k := newKafka(o.Brokers, o.Security)
	n, err := k.partitions(ctx, o.Topic)
	if err != nil {
		return plan, err
	}
	state, members, err := k.groupState(ctx, o.Group)
	if err != nil {
		return plan, err
	}
	if strings.EqualFold(state, "Dead") {
		return plan, fmt.Errorf("%w %q (state Dead: it never committed)", errUnknownGroup, o.Group)
	}
	if members > 0 {
		return plan, fmt.Errorf("%w: %q is %s with %d member(s); stop its consumers first", errGroupActive, o.Group, state, members)
	}
	cur, err := k.committed(ctx, o.Group, o.Topic, n)
	if err != nil {
		return plan, err
	}
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	first, err := k.listFirst(ctx, o.Topic, parts)
	if err != nil {
		return plan, err
	}
	end, err := k.offsets(ctx, o.Topic, parts, kafka.LastOffsetOf)
	if err != nil {
		return plan, err
	}
	var at map[int]int64
	if !o.ToTime.IsZero() {
		if at, err = k.offsets(ctx, o.Topic, parts, func(p int) kafka.OffsetRequest { return kafka.TimeOffsetOf(p, o.ToTime) }); err != nil {
			return plan, err
		}
	}
	commit := map[string][]kafka.OffsetCommit{}
	for p := 0; p < n; p++ {
		c := cur[p]
		if c < 0 {
			c = end[p] // never committed: treat as caught up
		}
		var nw int64
		switch {
		case o.ToOffset >= 0:
			nw = o.ToOffset
		case at != nil:
			nw = at[p]
			if nw < 0 {
				nw = end[p]
			}
		default:
			nw = c - o.Back
		}
		nw = min(max(nw, first[p]), end[p])
		plan.Moves = append(plan.Moves, Move{Partition: p, Current: c, New: nw})
		if c > nw {
			plan.Redelivered += c - nw
		}
		commit[o.Topic] = append(commit[o.Topic], kafka.OffsetCommit{Partition: p, Offset: nw})
	}
	if !o.Execute {
		return plan, nil
	}
	res, err := k.c.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: o.Group, GenerationID: -1, Topics: commit})
	if err != nil {
		return plan, fmt.Errorf("commit offsets of %s: %w", o.Group, err)
	}
	for _, ps := range res.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return plan, fmt.Errorf("commit offset of %s on %s/%d: %w", o.Group, o.Topic, p.Partition, p.Error)
			}
		}
	}
	plan.Executed = true
	return plan, nil
}
