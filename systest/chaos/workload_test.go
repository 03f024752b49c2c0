package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/kafkapubsub"
)

// Record sources, in header srcHeader, so the audit can tell where a record
// came from (it never trusts the generator for what was committed: that it
// reads from the log).
const (
	srcHeader = "chaos-src"
	srcMain   = "main"  // the ordered stream, murmur2 (Kafka's default partitioner)
	srcAlt    = "alt"   // the producer with another partitioner (FNV-1a)
	srcTxn    = "txn"   // transactional producers
	srcLate   = "late"  // exact copies produced after the faults
	srcEnd    = "end"   // one end marker per partition, produced last
	typeTopup = "topup" // command types, as the ledger worker defines them
	typeHold  = "hold"
	typeCapt  = "capture"
	typeRel   = "release"
	typeRef   = "refund"
)

// command is the ledger's command as it travels on Kafka.
type command struct {
	CommandID string `json:"command_id"`
	Type      string `json:"type"`
	Account   string `json:"account"`
	Amount    int64  `json:"amount"`
	HoldID    string `json:"hold_id,omitempty"`
}

// parse is the suite's own reading of a command: strict JSON, the fields
// the ledger requires. ok is false for a malformed record.
func parse(b []byte) (command, bool) {
	var c command
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || dec.More() {
		return c, false
	}
	if c.CommandID == "" || c.Account == "" || c.Amount <= 0 {
		return c, false
	}
	switch c.Type {
	case typeTopup:
		return c, true
	case typeHold, typeCapt, typeRel, typeRef:
		return c, c.HoldID != ""
	}
	return c, false
}

// workload is what the producers send: the ordered main stream (cut into
// chunks produced during the faults), the other partitioner's records, and
// copies held back until after the faults.
type workload struct {
	main, alt, late, lateAlt []*kgo.Record
	// uuids of the malformed records and key reuses the generator made.
	malformed, reused int
}

type genConfig struct {
	commands   int  // distinct commands in the main stream
	accountsA  int  // accounts with the full command mix, all on one partition each
	accountsB  int  // top-up-only accounts, written from several partitions
	crossParts bool // the FNV producer: distinct top-ups and copies of B top-ups on other partitions
}

func record(src, key string, value []byte, uuid string) *kgo.Record {
	r := &kgo.Record{Key: []byte(key), Value: value, Headers: []kgo.RecordHeader{{Key: srcHeader, Value: []byte(src)}}}
	if uuid != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: kafkapubsub.UUIDHeader, Value: []byte(uuid)})
	}
	return r
}

func (r0 *workloadRand) uuid() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(r0.IntN(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// uuidv7 is a UUIDv7 minted now: 48 bits of Unix milliseconds from the
// wall clock, the rest from the seeded source, so that a run repeats apart
// from the time.
func (r0 *workloadRand) uuidv7() string {
	var b [16]byte
	ms := uint64(time.Now().UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	for i := 6; i < 16; i++ {
		b[i] = byte(r0.IntN(256))
	}
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// id is a message's ID: a random UUIDv4, or with mixed IDs a UUIDv7 or a
// UUIDv4 at even odds.
func (r0 *workloadRand) id() string {
	if r0.mixed && r0.IntN(2) == 0 {
		return r0.uuidv7()
	}
	return r0.uuid()
}

// workloadRand is the workload's seeded source. mixed makes half the IDs
// UUIDv7 (CHAOS_KEY_LAYOUT=partitioned: keys in time partitions beside
// keys in the partition for the others); without it every ID is a UUIDv4.
type workloadRand struct {
	*rand.Rand
	mixed bool
}

// holdID is the ID of the hold that command id opens: 12 hex digits of
// the ID's random part (a UUIDv7 starts with its time).
func holdID(id string) string {
	if len(id) == 36 && id[14] == '7' {
		return "h-" + id[24:]
	}
	return "h-" + id[:13]
}

func copyRecord(src string, r *kgo.Record) *kgo.Record {
	return record(src, string(r.Key), append([]byte(nil), r.Value...), header(r.Headers, kafkapubsub.UUIDHeader))
}

func header(hs []kgo.RecordHeader, k string) string {
	for _, h := range hs {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// generate makes the workload. Accounts "a-…" get the whole command mix
// (top-ups, holds, captures, releases, refunds, some of which break a rule
// and are rejected) from the main producer only, so each one's records sit
// on one partition in order; accounts "b-…" only get top-ups, from every
// producer and partitioner, so their result does not depend on the order in
// which partitions are processed. Key reuses stay on their original's
// partition, after it, so the original is the one that must win.
func generate(rnd *workloadRand, cfg genConfig) *workload {
	w := &workload{}
	holds := map[string][]string{}
	createdB := map[string]bool{}
	var sentA, sentB []*kgo.Record
	emit := func(src string, c command) *kgo.Record {
		payload, _ := json.Marshal(c)
		return record(src, c.Account, payload, c.CommandID)
	}
	accA := func(i int) string { return fmt.Sprintf("a-%03d", i) }
	accB := func(i int) string { return fmt.Sprintf("b-%03d", i) }
	for i := 0; i < cfg.accountsA; i++ {
		r := emit(srcMain, command{CommandID: rnd.id(), Type: typeTopup, Account: accA(i), Amount: 300 + rnd.Int64N(300)})
		w.main = append(w.main, r)
		sentA = append(sentA, r)
	}
	for n := cfg.accountsA; n < cfg.commands; n++ {
		if rnd.Float64() < 0.3 {
			c := command{CommandID: rnd.id(), Type: typeTopup, Account: accB(rnd.IntN(cfg.accountsB)), Amount: 1 + rnd.Int64N(100)}
			if cfg.crossParts && !createdB[c.Account] {
				// A new account's first two top-ups, one through each
				// partitioner, side by side: both create the account.
				twin := command{CommandID: rnd.id(), Type: typeTopup, Account: c.Account, Amount: 1 + rnd.Int64N(100)}
				w.alt = append(w.alt, emit(srcAlt, twin))
				n++
			}
			createdB[c.Account] = true
			if cfg.crossParts && rnd.Float64() < 0.25 {
				w.alt = append(w.alt, emit(srcAlt, c))
				continue
			}
			r := emit(srcMain, c)
			w.main = append(w.main, r)
			sentB = append(sentB, r)
		} else {
			a := accA(rnd.IntN(cfg.accountsA))
			c := command{CommandID: rnd.id(), Account: a, Amount: 1 + rnd.Int64N(150)}
			hs := holds[a]
			switch x := rnd.Float64(); {
			case x < 0.25 || (len(hs) == 0 && x < 0.7):
				c.Type = typeTopup
			case x < 0.55 || len(hs) == 0:
				c.Type, c.HoldID = typeHold, holdID(c.CommandID)
				holds[a] = append(hs, c.HoldID)
			case x < 0.75:
				c.Type, c.HoldID = typeCapt, hs[rnd.IntN(len(hs))]
			case x < 0.88:
				c.Type, c.HoldID = typeRel, hs[rnd.IntN(len(hs))]
			default:
				c.Type, c.HoldID = typeRef, hs[rnd.IntN(len(hs))]
			}
			r := emit(srcMain, c)
			w.main = append(w.main, r)
			sentA = append(sentA, r)
		}
		// Exact copies on the same partition, later in the stream.
		if rnd.Float64() < 0.05 {
			all := sentA
			if len(sentB) > 0 && rnd.Float64() < 0.3 {
				all = sentB
			}
			w.main = append(w.main, copyRecord(srcMain, all[rnd.IntN(len(all))]))
		}
		// Exact copies of B top-ups on the partition FNV picks.
		if cfg.crossParts && len(sentB) > 0 && rnd.Float64() < 0.08 {
			w.alt = append(w.alt, copyRecord(srcAlt, sentB[rnd.IntN(len(sentB))]))
		}
		// A key reused with another payload, after its original.
		if rnd.Float64() < 0.01 {
			orig := sentA[rnd.IntN(len(sentA))]
			c, _ := parse(orig.Value)
			c.Amount += 1 + rnd.Int64N(40)
			payload, _ := json.Marshal(c)
			w.main = append(w.main, record(srcMain, c.Account, payload, c.CommandID))
			w.reused++
		}
		if rnd.Float64() < 0.01 {
			a := accA(rnd.IntN(cfg.accountsA))
			bad := [][]byte{
				[]byte("not json at all"),
				[]byte(`{"command_id":"` + rnd.uuid() + `","type":"steal","account":"` + a + `","amount":5}`),
				{},
				[]byte(`{"command_id":"` + rnd.uuid() + `","type":"topup","account":"` + a + `","amount":-3}`),
				[]byte(`{"command_id":"` + rnd.uuid() + `","type":"topup","account":"` + a + `","amount":3,"extra":1}`),
			}
			w.main = append(w.main, record(srcMain, a, bad[rnd.IntN(len(bad))], rnd.id()))
			w.malformed++
		}
		// Copies held back until the faults are over.
		if rnd.Float64() < 0.02 {
			if len(sentB) > 0 && rnd.Float64() < 0.4 {
				r := copyRecord(srcLate, sentB[rnd.IntN(len(sentB))])
				if cfg.crossParts {
					w.lateAlt = append(w.lateAlt, r) // through the FNV partitioner
				} else {
					w.late = append(w.late, r)
				}
			} else {
				w.late = append(w.late, copyRecord(srcLate, sentA[rnd.IntN(len(sentA))]))
			}
		}
	}
	return w
}
