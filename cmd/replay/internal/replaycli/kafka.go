package replaycli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/describegroups"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// Range selects records per partition: [From, To) offsets, or times.
type Range struct {
	// Partition limits the range to one partition; -1 means all.
	Partition int
	// FromOffset and ToOffset bound offsets (ToOffset exclusive); -1 means
	// the start and the end of the log as found when the command starts.
	FromOffset, ToOffset int64
	// FromTime and ToTime bound record timestamps instead, when set.
	FromTime, ToTime time.Time
}

// AllRange is every record of every partition.
func AllRange() Range { return Range{Partition: -1, FromOffset: -1, ToOffset: -1} }

// span is one partition's resolved [from, to).
type span struct {
	Partition int   `json:"partition"`
	From      int64 `json:"from"`
	To        int64 `json:"to"`
}

func (s span) count() int64 { return max(s.To-s.From, 0) }

type kafkaClient struct {
	brokers []string
	sec     kafkapubsub.Security
	c       *kafka.Client
}

func newKafka(brokers []string, sec kafkapubsub.Security) *kafkaClient {
	return &kafkaClient{brokers: brokers, sec: sec, c: &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: sec.Transport()}}
}

// errUnknownTopic and errUnknownGroup are user errors with exit codes.
var (
	errUnknownTopic = errors.New("unknown topic")
	errUnknownGroup = errors.New("unknown consumer group")
	errUsage        = errors.New("usage")
)

func (k *kafkaClient) partitions(ctx context.Context, topic string) (int, error) {
	md, err := k.c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("kafka at %v: %w", k.brokers, err)
	}
	if len(md.Topics) != 1 || errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) || len(md.Topics[0].Partitions) == 0 {
		return 0, fmt.Errorf("%w %q", errUnknownTopic, topic)
	}
	if md.Topics[0].Error != nil {
		return 0, fmt.Errorf("topic %s: %w", topic, md.Topics[0].Error)
	}
	return len(md.Topics[0].Partitions), nil
}

// offsets lists one offset per partition: the end (LastOffsetOf) or the
// first at or after a time (TimeOffsetOf; -1 when there is none).
func (k *kafkaClient) offsets(ctx context.Context, topic string, parts []int, req func(p int) kafka.OffsetRequest) (map[int]int64, error) {
	return k.list(ctx, topic, parts, req, func(p kafka.PartitionOffsets) int64 {
		for o := range p.Offsets { // a request by time
			return o
		}
		if p.LastOffset >= 0 {
			return p.LastOffset
		}
		return -1
	})
}

// listFirst lists each partition's first offset.
func (k *kafkaClient) listFirst(ctx context.Context, topic string, parts []int) (map[int]int64, error) {
	return k.list(ctx, topic, parts, kafka.FirstOffsetOf, func(p kafka.PartitionOffsets) int64 { return p.FirstOffset })
}

// list lists one offset per partition of parts, picked from its answer.
func (k *kafkaClient) list(ctx context.Context, topic string, parts []int, req func(p int) kafka.OffsetRequest, pick func(kafka.PartitionOffsets) int64) (map[int]int64, error) {
	rs := make([]kafka.OffsetRequest, len(parts))
	for i, p := range parts {
		rs[i] = req(p)
	}
	res, err := kafkaadmin.ListOffsets(ctx, k.c, topic, rs)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(res))
	for p, o := range res {
		out[p] = pick(o)
	}
	return out, nil
}

// resolve turns r into per-partition spans of existing records.
func (k *kafkaClient) resolve(ctx context.Context, topic string, r Range) ([]span, error) {
	n, err := k.partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	var parts []int
	if r.Partition >= 0 {
		if r.Partition >= n {
			return nil, fmt.Errorf("%w: --partition %d: topic %s has %d partition(s), 0 to %d", errUsage, r.Partition, topic, n, n-1)
		}
		parts = []int{r.Partition}
	} else {
		for p := 0; p < n; p++ {
			parts = append(parts, p)
		}
	}
	first, err := k.listFirst(ctx, topic, parts)
	if err != nil {
		return nil, err
	}
	end, err := k.offsets(ctx, topic, parts, kafka.LastOffsetOf)
	if err != nil {
		return nil, err
	}
	var fromT, toT map[int]int64
	if !r.FromTime.IsZero() {
		if fromT, err = k.offsets(ctx, topic, parts, func(p int) kafka.OffsetRequest { return kafka.TimeOffsetOf(p, r.FromTime) }); err != nil {
			return nil, err
		}
	}
	if !r.ToTime.IsZero() {
		if toT, err = k.offsets(ctx, topic, parts, func(p int) kafka.OffsetRequest { return kafka.TimeOffsetOf(p, r.ToTime) }); err != nil {
			return nil, err
		}
	}
	var spans []span
	for _, p := range parts {
		s := span{Partition: p, From: first[p], To: end[p]}
		if r.FromOffset >= 0 {
			s.From = max(s.From, r.FromOffset)
		}
		if r.ToOffset >= 0 {
			s.To = min(s.To, r.ToOffset)
		}
		if fromT != nil {
			if o := fromT[p]; o >= 0 {
				s.From = max(s.From, o)
			} else {
				s.From = s.To // nothing at or after FromTime
			}
		}
		if toT != nil {
			if o := toT[p]; o >= 0 {
				s.To = min(s.To, o)
			}
		}
		spans = append(spans, s)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].Partition < spans[j].Partition })
	return spans, nil
}

// read streams each span's records, partitions concurrently, each in
// order; each is called from one goroutine per partition.
func (k *kafkaClient) read(ctx context.Context, topic string, spans []span, each func(kafka.Message) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(spans))
	for i, s := range spans {
		if s.count() == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.brokers, Dialer: k.sec.Dialer(10 * time.Second), Topic: topic, Partition: s.Partition,
				MaxWait: 100 * time.Millisecond, MaxBytes: 10 << 20})
			defer r.Close()
			if err := r.SetOffset(s.From); err != nil {
				errs[i] = err
				return
			}
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					errs[i] = fmt.Errorf("read %s/%d: %w", topic, s.Partition, err)
					return
				}
				if m.Offset >= s.To {
					return
				}
				if err := each(m); err != nil {
					errs[i] = err
					return
				}
				if m.Offset+1 >= s.To {
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// samePartition keeps a record in the partition it came from when the
// target has it, else places it by key as Kafka's Java producer does.
type samePartition struct{ fallback kafka.Murmur2Balancer }

func (b *samePartition) Balance(msg kafka.Message, partitions ...int) int {
	for _, p := range partitions {
		if p == msg.Partition {
			return p
		}
	}
	return b.fallback.Balance(msg, partitions...)
}

// groupState describes a consumer group, waiting up to 30s for a
// coordinator that is moving or loading.
func (k *kafkaClient) groupState(ctx context.Context, group string) (state string, members int, err error) {
	type desc struct {
		state   string
		members int
	}
	d, err := kafkaadmin.Do(ctx, kafkaadmin.Window, func() (desc, error) {
		state, members, err := k.groupStateOnce(ctx, group)
		return desc{state, members}, err
	})
	return d.state, d.members, err
}

// groupStateOnce describes the group: a classic group (kafka-go's, or
// franz-go's classic protocol) with DescribeGroups, a consumer group of
// the KIP-848 protocol with ConsumerGroupDescribe. The members' metadata is
// not decoded: only their count matters here, and clients write versions of
// it that kafka-go does not read (franz-go's cooperative-sticky members).
// A group that neither knows is "Dead".
func (k *kafkaClient) groupStateOnce(ctx context.Context, group string) (state string, members int, err error) {
	rctx, cancel := context.WithTimeout(ctx, k.c.Timeout)
	defer cancel()
	tr := k.c.Transport
	if tr == nil {
		tr = kafka.DefaultTransport
	}
	m, err := tr.RoundTrip(rctx, k.c.Addr, &describegroups.Request{Groups: []string{group}})
	if err != nil {
		return "", 0, fmt.Errorf("describe group %s: %w", group, err)
	}
	res, ok := m.(*describegroups.Response)
	if !ok || len(res.Groups) != 1 {
		return "", 0, fmt.Errorf("%w %q", errUnknownGroup, group)
	}
	g := res.Groups[0]
	switch code := g.ErrorCode; {
	case code == 0 && g.GroupState != "Dead":
		return g.GroupState, len(g.Members), nil
	case code != 0 && kafka.Error(code) != kafka.GroupIdNotFound:
		return "", 0, fmt.Errorf("describe group %s: %w", group, kafka.Error(code))
	}
	return k.consumerGroupState(ctx, group)
}

// consumerGroupState describes a group that is not a classic one: a
// consumer group of the KIP-848 protocol, or none ("Dead"). kafka-go does
// not speak ConsumerGroupDescribe; franz-go does. Each seed broker is asked
// in turn, so that one that is down does not fail the call; a broker's
// error is a kafka.Error, which kafkaadmin.Transient knows.
func (k *kafkaClient) consumerGroupState(ctx context.Context, group string) (state string, members int, err error) {
	for _, seed := range k.brokers {
		state, members, err = k.consumerGroupStateAt(ctx, seed, group)
		var ke *kerr.Error
		switch {
		case errors.As(err, &ke):
			return "", 0, fmt.Errorf("describe group %s: %w", group, kafka.Error(ke.Code))
		case err == nil || ctx.Err() != nil:
			return state, members, err
		}
	}
	return "", 0, fmt.Errorf("describe group %s: %w", group, err)
}

func (k *kafkaClient) consumerGroupStateAt(ctx context.Context, seed, group string) (state string, members int, err error) {
	cl, err := kgo.NewClient(append(kgopubsub.SecurityOptions(k.sec), kgo.SeedBrokers(seed), kgo.RequestRetries(2))...)
	if err != nil {
		return "", 0, err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, k.c.Timeout)
	defer cancel()
	av, err := kmsg.NewPtrApiVersionsRequest().RequestWith(rctx, cl)
	if err != nil {
		return "", 0, err
	}
	if !slices.ContainsFunc(av.ApiKeys, func(k kmsg.ApiVersionsResponseApiKey) bool {
		return k.ApiKey == kmsg.ConsumerGroupDescribe.Int16()
	}) {
		return "Dead", 0, nil // brokers before KIP-848: no such group
	}
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	res, err := req.RequestWith(rctx, cl)
	if err != nil {
		return "", 0, err
	}
	if len(res.Groups) != 1 {
		return "Dead", 0, nil
	}
	g := res.Groups[0]
	switch code := g.ErrorCode; code {
	case 0:
		return g.State, len(g.Members), nil
	case kerr.GroupIDNotFound.Code, kerr.UnsupportedVersion.Code:
		// None, or brokers with the KIP-848 protocol off: no such group.
		return "Dead", 0, nil
	default:
		return "", 0, kerr.ErrorForCode(code)
	}
}

// committed returns the group's committed offsets on topic (-1: none).
func (k *kafkaClient) committed(ctx context.Context, group, topic string, n int) (map[int]int64, error) {
	return kafkaadmin.Committed(ctx, k.c, group, topic, n)
}
