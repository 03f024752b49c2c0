package kgopubsub

import (
	"context"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/delivery"
)

// partition is one assigned partition: the records polled for it and not
// yet taken by its goroutine, which delivers them through a window. When
// more than pauseAt records wait, fetching the partition pauses (franz-go
// then drops what it buffered for it and fetches it again on resume), so
// a partition held by an unacked message holds its own records and no
// other partition's.
type partition struct {
	topic string
	id    int32
	cl    *kgo.Client

	mu      sync.Mutex
	queue   [][]*kgo.Record
	queued  int
	paused  bool
	pauseAt int
	wake    chan struct{}

	stop context.CancelFunc
	done chan struct{}
}

func newPartition(cl *kgo.Client, topic string, id int32, pauseAt int) *partition {
	return &partition{topic: topic, id: id, cl: cl, pauseAt: pauseAt, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// push hands records polled for the partition to its goroutine. It never
// waits.
func (p *partition) push(rs []*kgo.Record) {
	if len(rs) == 0 {
		return
	}
	p.mu.Lock()
	p.queue = append(p.queue, rs)
	p.queued += len(rs)
	if !p.paused && p.queued >= p.pauseAt {
		p.paused = true
		p.cl.PauseFetchPartitions(map[string][]int32{p.topic: {p.id}})
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// pop returns the oldest polled records, or nil.
func (p *partition) pop() []*kgo.Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		return nil
	}
	rs := p.queue[0]
	p.queue[0] = nil
	p.queue = p.queue[1:]
	p.queued -= len(rs)
	if p.paused && p.queued < p.pauseAt/2 {
		p.paused = false
		p.cl.ResumeFetchPartitions(map[string][]int32{p.topic: {p.id}})
	}
	return rs
}

// resume lets the partition be fetched again once its goroutine ended (a
// revoked partition assigned again must not stay paused).
func (p *partition) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		p.cl.ResumeFetchPartitions(map[string][]int32{p.topic: {p.id}})
	}
}

// consume delivers p's records in order through a window of up to
// MaxInFlight messages (delivery.Partition), as kafkapubsub's Subscriber
// does. subCtx carries the subscription's values into message contexts;
// stopCtx ends the delivery, after which the in-flight messages drain.
// acked is called with the next offset to commit each time the watermark
// moves.
func consume(cfg delivery.Config, subCtx, stopCtx context.Context, p *partition, out chan<- *message.Message, acked func(next int64)) {
	defer close(p.done)
	d := &delivery.Partition[*kgo.Record]{
		Config: cfg, Topic: p.topic, Partition: p.id, Start: -1,
		Meta:    func(r **kgo.Record) (int64, []byte) { return (*r).Offset, (*r).Key },
		Prepare: (&preparer{partition: strconv.Itoa(int(p.id))}).prepare,
		Wake:    p.wake, Pop: p.pop,
		// Records polled before a seek (a partition fetched again from an
		// earlier offset) are never taken twice.
		SkipSeen: true,
	}
	d.Run(subCtx, stopCtx, out, acked)
}

// preparer makes the messages of one partition's records.
type preparer struct {
	partition string
	stamps    delivery.Stamps
}

// prepare makes the message of a delivery of *r (delivery.Partition gives
// it its context).
func (pr *preparer) prepare(r **kgo.Record) *message.Message {
	return toWatermill(*r, pr.partition, &pr.stamps)
}
