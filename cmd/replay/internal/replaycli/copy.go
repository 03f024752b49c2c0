package replaycli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/mdkeys"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// CopyConfig configures Copy.
type CopyConfig struct {
	Brokers []string
	// Security holds the TLS and SASL settings. Defaults to plain TCP.
	Security kafkapubsub.Security
	From     string // source topic
	// To is the target topic. Required; it may be From (a redelivery to
	// From's consumers) only with IntoSource.
	To string
	// IntoSource allows To to be From: the records are appended to the
	// topic they were read from, and its consumers get them again.
	IntoSource bool
	Range      Range
	// Duplicate writes each record this many times. Defaults to 1.
	Duplicate int
	// Mutate changes each payload while keeping its UUID header: a consumer
	// with the dedupe middleware must report key reuse and apply nothing.
	Mutate bool
	// DryRun resolves the range and reports what would be written.
	DryRun   bool
	Progress *progress
	// each sees every record written (times Duplicate) before it is
	// written; it is called concurrently for different partitions. An
	// error stops the copy.
	each func(written kafka.Message, copies int) error
}

// CopyResult reports a copy.
type CopyResult struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Spans   []span `json:"spans"`
	Read    int64  `json:"read"`
	Written int64  `json:"written"`
	DryRun  bool   `json:"dry_run"`
	// Oldest is the timestamp of the oldest record read (zero when none).
	Oldest  time.Time `json:"oldest,omitzero"`
	Elapsed string    `json:"elapsed"`
}

// errEmptyRange: the range holds no records.
var errEmptyRange = fmt.Errorf("the range holds no records")

// Copy re-publishes a range of a topic, keeping keys, headers (the message
// UUID) and per-partition order.
func Copy(ctx context.Context, o CopyConfig) (CopyResult, error) {
	if o.Duplicate == 0 {
		o.Duplicate = 1
	}
	res := CopyResult{From: o.From, To: o.To, DryRun: o.DryRun}
	switch {
	case o.To == "":
		return res, fmt.Errorf("%w: --to is required: the target topic (to redeliver into %s itself, give --to %s --into-source)", errUsage, o.From, o.From)
	case o.To == o.From && !o.IntoSource:
		return res, fmt.Errorf("%w: --to is the source topic %s: add --into-source to append its records to it again (its consumers get them twice)", errUsage, o.From)
	}
	if o.Duplicate < 1 {
		return res, fmt.Errorf("%w: --duplicate must be 1 or more", errUsage)
	}
	k := newKafka(o.Brokers, o.Security)
	spans, err := k.resolve(ctx, o.From, o.Range)
	if err != nil {
		return res, err
	}
	res.Spans = spans
	var total int64
	for _, s := range spans {
		total += s.count()
	}
	if total == 0 {
		return res, errEmptyRange
	}
	if _, err := k.partitions(ctx, o.To); err != nil {
		return res, err
	}
	start := time.Now()
	if o.DryRun {
		res.Written = total * int64(o.Duplicate)
		res.Read = total
		res.Elapsed = time.Since(start).String()
		return res, nil
	}
	w := &kafka.Writer{Addr: kafka.TCP(o.Brokers...), Topic: o.To, Balancer: &samePartition{}, Transport: o.Security.Transport(),
		RequiredAcks: kafka.RequireAll, BatchSize: 500, BatchTimeout: 10 * time.Millisecond, MaxAttempts: 10}
	defer w.Close()
	o.Progress.start("copy", total*int64(o.Duplicate))
	// One batch per partition: partitions are read and written concurrently,
	// each in order.
	maxPart := 0
	for _, s := range spans {
		maxPart = max(maxPart, s.Partition)
	}
	batches := make([][]kafka.Message, maxPart+1)
	var read, wrote atomic.Int64
	var oldest sync.Mutex
	flush := func(p int) error {
		if len(batches[p]) == 0 {
			return nil
		}
		if err := w.WriteMessages(ctx, batches[p]...); err != nil {
			return fmt.Errorf("write to %s: %w", o.To, err)
		}
		wrote.Add(int64(len(batches[p])))
		o.Progress.add(int64(len(batches[p])))
		batches[p] = batches[p][:0]
		return nil
	}
	err = k.read(ctx, o.From, spans, func(m kafka.Message) error {
		read.Add(1)
		oldest.Lock()
		if res.Oldest.IsZero() || m.Time.Before(res.Oldest) {
			res.Oldest = m.Time
		}
		oldest.Unlock()
		out := kafka.Message{Partition: m.Partition, Key: m.Key, Value: m.Value, Headers: withoutShareHeaders(m.Headers)}
		if o.Mutate {
			out.Value = mutate(m.Value)
		}
		if o.each != nil {
			if err := o.each(out, o.Duplicate); err != nil {
				return err
			}
		}
		for i := 0; i < o.Duplicate; i++ {
			batches[m.Partition] = append(batches[m.Partition], out)
		}
		if len(batches[m.Partition]) >= 500 || m.Offset+1 >= spanEnd(spans, m.Partition) {
			return flush(m.Partition)
		}
		return nil
	})
	for p := range batches {
		if err == nil {
			err = flush(p)
		}
	}
	res.Read, res.Written = read.Load(), wrote.Load()
	o.Progress.done()
	res.Elapsed = time.Since(start).Round(time.Millisecond).String()
	return res, err
}

// mutate changes a payload: a JSON object gets a "_replay_mutated" field;
// anything else gets a suffix.
func mutate(p []byte) []byte {
	var obj map[string]json.RawMessage
	if json.Unmarshal(p, &obj) == nil && obj != nil {
		obj["_replay_mutated"] = json.RawMessage("true")
		if b, err := json.Marshal(obj); err == nil {
			return b
		}
	}
	return append(bytes.Clone(p), []byte(" (replay mutated)")...)
}

func spanEnd(spans []span, p int) int64 {
	for _, s := range spans {
		if s.Partition == p {
			return s.To
		}
	}
	return 0
}

// withoutShareHeaders returns hs without a share group's copy headers
// (internal/mdkeys): a record copied again is no share copy of the record
// its origin header names, which a share group's member could have
// dead-lettered, and would then reject unhandled.
func withoutShareHeaders(hs []kafka.Header) []kafka.Header {
	out := hs[:0:0]
	for _, h := range hs {
		if !mdkeys.ShareHeader(h.Key) {
			out = append(out, h)
		}
	}
	return out
}
