package ledger

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// Report is what Verify found.
type Report struct {
	Records, Unique, Duplicates, KeyReused, Malformed int
	Accounts                                          int
	// Mismatches lists accounts whose balances differ from the expected ones.
	Mismatches []string
}

// Match reports whether every balance is as expected.
func (r Report) Match() bool { return len(r.Mismatches) == 0 }

// ErrOrderDependent is wrapped by Verify's error when the commands topic
// names one hold from accounts whose records are on different partitions:
// the hold goes to whichever is consumed first, Kafka orders nothing across
// partitions, so no recomputation can know the balances a correct worker
// reached.
var ErrOrderDependent = errors.New("ledger: the balances depend on the order of partitions")

// Verify reads the commands topic from the start to its end, recomputes the
// balances that applying each valid command exactly once gives (first
// occurrence of a command_id wins; a later copy is a duplicate, or a key
// reuse if its payload differs; malformed records apply nothing) and
// compares them with the accounts table. Each account's records are on one
// partition in order (the workload keys them by account), which fixes the
// result of every command but one: a hold ID that accounts on different
// partitions ask for. Verify refuses such a log with ErrOrderDependent.
func Verify(ctx context.Context, pool *pgxpool.Pool, schema string, brokers []string, topic string) (Report, error) {
	recs, err := readTopic(ctx, brokers, topic)
	if err != nil {
		return Report{}, err
	}
	var rep Report
	st := NewMemState()
	seen := map[string]dedupe.Fingerprint{}
	type asker struct {
		account   string
		partition int
	}
	holds := map[string]asker{} // hold id -> the first account to ask for it
	for p, part := range recs {
		for _, m := range part {
			rep.Records++
			var id string
			for _, h := range m.Headers {
				if h.Key == kafkapubsub.UUIDHeader {
					id = string(h.Value)
				}
			}
			fp := dedupe.FingerprintOf(m.Value)
			if prev, ok := seen[id]; ok {
				if prev == fp {
					rep.Duplicates++
				} else {
					rep.KeyReused++
				}
				continue
			}
			seen[id] = fp
			c, err := Parse(m.Value)
			if err != nil || id == "" {
				rep.Malformed++
				continue
			}
			rep.Unique++
			if c.Type == Hold {
				if a, ok := holds[c.HoldID]; !ok {
					holds[c.HoldID] = asker{c.Account, p}
				} else if a.account != c.Account && a.partition != p {
					return rep, fmt.Errorf("%w: hold %s is asked for by account %s on partition %d and by account %s on partition %d",
						ErrOrderDependent, c.HoldID, a.account, a.partition, c.Account, p)
				}
			}
			if err := Apply(st, c); err != nil && !IsRejection(err) {
				return rep, err
			}
		}
	}
	got, err := Balances(ctx, pool, schema)
	if err != nil {
		return rep, err
	}
	names := map[string]bool{}
	for a := range st.Accounts {
		names[a] = true
	}
	for a := range got {
		names[a] = true
	}
	for a := range names {
		if want, have := st.Accounts[a], got[a]; want != have {
			rep.Mismatches = append(rep.Mismatches, fmt.Sprintf("%s: available %d held %d, want %d and %d", a, have.Available, have.Held, want.Available, want.Held))
		}
	}
	sort.Strings(rep.Mismatches)
	rep.Accounts = len(names)
	return rep, nil
}

// readTopic reads every partition of topic from the start to its current
// end, each in offset order.
func readTopic(ctx context.Context, brokers []string, topic string) ([][]kafka.Message, error) {
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	var md *kafka.MetadataResponse
	var err error
	// A topic created a moment ago may not be known to the broker yet: ask
	// again for a while.
	for wait, deadline := 50*time.Millisecond, time.Now().Add(10*time.Second); ; wait = min(2*wait, time.Second) {
		md, err = c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil {
			return nil, fmt.Errorf("ledger: metadata of %s: %w", topic, err)
		}
		if len(md.Topics) == 1 && md.Topics[0].Error == nil {
			break
		}
		if len(md.Topics) != 1 || !errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) || time.Now().After(deadline) {
			return nil, fmt.Errorf("ledger: topic %s: %v", topic, md.Topics)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	n := len(md.Topics[0].Partitions)
	end, err := endOffsets(ctx, c, topic, n)
	if err != nil {
		return nil, err
	}
	out := make([][]kafka.Message, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for p := 0; p < n; p++ {
		if end[p] == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
			defer r.Close()
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					errs[p] = fmt.Errorf("ledger: read %s/%d: %w", topic, p, err)
					return
				}
				out[p] = append(out[p], m)
				if m.Offset+1 >= end[p] {
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
