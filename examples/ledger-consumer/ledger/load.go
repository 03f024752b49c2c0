package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/kafkapubsub"
)

// LoadConfig shapes a generated workload. The shares are taken as they
// are: 0 means none. DefaultLoad returns the demo's mix.
type LoadConfig struct {
	// Commands is the number of distinct commands, at least 1.
	Commands int
	// Accounts is the number of accounts, at least 1.
	Accounts int
	// Duplicates is the share (0 to 1) of extra records that re-send an
	// earlier command unchanged (same command_id).
	Duplicates float64
	// KeyReuse is the share (0 to 1) of extra records that re-use an
	// earlier command_id with a different amount.
	KeyReuse float64
	// Malformed is the share (0 to 1) of extra records that are not valid
	// commands.
	Malformed float64
	// Seed makes the workload reproducible. Defaults to the current time.
	Seed uint64
}

// DefaultLoad is the demo's workload: 2000 commands over 50 accounts, with
// 10 % duplicates, 2 % key reuses and 2 % malformed records.
func DefaultLoad() LoadConfig {
	return LoadConfig{Commands: 2000, Accounts: 50, Duplicates: 0.10, KeyReuse: 0.02, Malformed: 0.02}
}

// Validate reports the first field out of range, naming its flag.
func (c LoadConfig) Validate() error {
	switch {
	case c.Commands < 1:
		return fmt.Errorf("ledger: --n is %d: give 1 or more commands", c.Commands)
	case c.Accounts < 1:
		return fmt.Errorf("ledger: --accounts is %d: give 1 or more accounts", c.Accounts)
	}
	for _, s := range []struct {
		flag string
		v    float64
	}{{"duplicates", c.Duplicates}, {"key-reuse", c.KeyReuse}, {"malformed", c.Malformed}} {
		if !(s.v >= 0 && s.v <= 1) { // NaN fails too
			return fmt.Errorf("ledger: --%s is %v: give a share from 0 (none) to 1", s.flag, s.v)
		}
	}
	return nil
}

// Workload is a generated sequence of records, in produce order.
type Workload struct {
	Records                                  []kafka.Message
	Unique, Duplicates, KeyReused, Malformed int
}

// Generate makes a workload: every account is topped up, then random
// commands follow (some of which break a rule and will be rejected), with
// duplicates, key reuses and malformed records mixed in after the commands
// they copy. Records are keyed by account, so an account's commands keep
// their order on Kafka.
// It fails when cfg is out of range (LoadConfig.Validate).
func Generate(cfg LoadConfig) (Workload, error) {
	if err := cfg.Validate(); err != nil {
		return Workload{}, err
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	rnd := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	var w Workload
	var sent []kafka.Message
	holds := map[string][]string{} // account -> hold ids
	emit := func(c Command) {
		payload, _ := json.Marshal(c)
		rec := kafka.Message{Key: []byte(c.Account), Value: payload, Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(c.CommandID)}}}
		w.Records = append(w.Records, rec)
		sent = append(sent, rec)
		w.Unique++
	}
	account := func(i int) string { return fmt.Sprintf("acc-%03d", i) }
	for i := 0; i < cfg.Accounts && w.Unique < cfg.Commands; i++ {
		emit(Command{CommandID: watermill.NewUUID(), Type: Topup, Account: account(i), Amount: 500 + rnd.Int64N(500)})
	}
	for w.Unique < cfg.Commands {
		a := account(rnd.IntN(cfg.Accounts))
		c := Command{CommandID: watermill.NewUUID(), Account: a, Amount: 1 + rnd.Int64N(200)}
		hs := holds[a]
		switch r := rnd.Float64(); {
		case r < 0.25 || (len(hs) == 0 && r < 0.7):
			c.Type = Topup
		case r < 0.55 || len(hs) == 0:
			// The hold's ID is its command's: unique, so no two accounts
			// name one hold (which of them got it would depend on the
			// order of their partitions).
			c.Type, c.HoldID = Hold, "hold-"+c.CommandID
			holds[a] = append(hs, c.HoldID)
		case r < 0.75:
			c.Type, c.HoldID = Capture, hs[rnd.IntN(len(hs))]
		case r < 0.88:
			c.Type, c.HoldID = Release, hs[rnd.IntN(len(hs))]
		default:
			c.Type, c.HoldID = Refund, hs[rnd.IntN(len(hs))]
		}
		emit(c)
		if rnd.Float64() < cfg.Duplicates {
			w.Records = append(w.Records, sent[rnd.IntN(len(sent))])
			w.Duplicates++
		}
		if rnd.Float64() < cfg.KeyReuse {
			orig := sent[rnd.IntN(len(sent))]
			var oc Command
			_ = json.Unmarshal(orig.Value, &oc)
			oc.Amount += 1 + rnd.Int64N(50)
			payload, _ := json.Marshal(oc)
			w.Records = append(w.Records, kafka.Message{Key: orig.Key, Value: payload, Headers: orig.Headers})
			w.KeyReused++
		}
		if rnd.Float64() < cfg.Malformed {
			bad := [][]byte{[]byte("not json at all"), []byte(`{"type":"steal","account":"` + a + `","amount":5}`), {}, []byte(`{"command_id":"x","type":"topup","account":"` + a + `","amount":-3}`)}
			w.Records = append(w.Records, kafka.Message{Key: []byte(a), Value: bad[rnd.IntN(len(bad))],
				Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(watermill.NewUUID())}}})
			w.Malformed++
		}
	}
	return w, nil
}

// Produce writes the workload's records to topic in order.
func Produce(ctx context.Context, brokers []string, topic string, recs []kafka.Message) error {
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: 500, BatchTimeout: 10 * time.Millisecond, MaxAttempts: 10}
	defer w.Close()
	for i := 0; i < len(recs); i += 1000 {
		end := min(i+1000, len(recs))
		// A topic created a moment ago may not be known to every broker
		// yet: ask again for a while.
		for wait, deadline := 50*time.Millisecond, time.Now().Add(30*time.Second); ; wait = min(2*wait, time.Second) {
			err := w.WriteMessages(ctx, recs[i:end]...)
			if err == nil {
				break
			}
			if !errors.Is(err, kafka.UnknownTopicOrPartition) || time.Now().After(deadline) {
				return fmt.Errorf("ledger: produce to %s: %w", topic, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		}
	}
	return nil
}
