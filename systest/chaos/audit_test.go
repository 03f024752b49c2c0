package chaos

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// rec is a record as the audit read it.
type rec struct {
	part        int32
	off         int64
	uuid, src   string
	value       []byte
	reason      string
	eventPrefix bool
}

// readTopic reads topic from the start on every partition, at the given
// isolation level, until done says it has everything.
func readTopic(ctx context.Context, brokers []string, topic string, parts int, committed bool, done func(last map[int32]int64, recs []rec) bool) ([]rec, error) {
	offs := map[int32]kgo.Offset{}
	for p := 0; p < parts; p++ {
		offs[int32(p)] = kgo.NewOffset().AtStart()
	}
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offs}),
		kgo.FetchIsolationLevel(iso), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var out []rec
	last := map[int32]int64{}
	for !done(last, out) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return out, fmt.Errorf("chaos: read %s (committed=%v): gave up after 2m with %d records, last offsets %v", topic, committed, len(out), last)
		}
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, rec{part: r.Partition, off: r.Offset, uuid: header(r.Headers, kafkapubsub.UUIDHeader), src: header(r.Headers, srcHeader),
				value: append([]byte(nil), r.Value...), reason: header(r.Headers, middleware.ReasonForPoisonedKey)})
			last[r.Partition] = r.Offset
		})
	}
	return out, nil
}

// readToEnd reads a topic that no transactional producer writes (events,
// dead letters) up to its log end.
func readToEnd(ctx context.Context, brokers []string, topic string, parts int) ([]rec, error) {
	ends, err := kafkaadmin.EndOffsets(ctx, &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}, topic, parts)
	if err != nil {
		return nil, err
	}
	return readTopic(ctx, brokers, topic, parts, true, func(last map[int32]int64, _ []rec) bool {
		for p, end := range ends {
			if end > 0 && last[int32(p)] < end-1 {
				return false
			}
		}
		return true
	})
}

// model recomputes the ledger from the distinct committed commands.
type model struct {
	accounts map[string]*[2]int64 // available, held
	holds    map[string]*holdState
	rejected map[string]bool
}

type holdState struct {
	account                              string
	amount, captured, released, refunded int64
}

func (m *model) acct(id string) *[2]int64 {
	a := m.accounts[id]
	if a == nil {
		a = new([2]int64)
		m.accounts[id] = a
	}
	return a
}

// apply applies c under the ledger's rules: available never goes negative,
// capture and release take at most a hold's remainder, refunds give back at
// most what was captured and not refunded; a command that breaks one is
// rejected and changes nothing.
func (m *model) apply(c command) {
	a := m.acct(c.Account)
	reject := func() { m.rejected[c.CommandID] = true }
	switch c.Type {
	case typeTopup:
		a[0] += c.Amount
		return
	case typeHold:
		if _, ok := m.holds[c.HoldID]; ok || a[0] < c.Amount {
			reject()
			return
		}
		a[0] -= c.Amount
		a[1] += c.Amount
		m.holds[c.HoldID] = &holdState{account: c.Account, amount: c.Amount}
		return
	}
	h, ok := m.holds[c.HoldID]
	if !ok || h.account != c.Account {
		reject()
		return
	}
	switch c.Type {
	case typeCapt, typeRel:
		if c.Amount > h.amount-h.captured-h.released {
			reject()
			return
		}
		a[1] -= c.Amount
		if c.Type == typeCapt {
			h.captured += c.Amount
		} else {
			h.released += c.Amount
			a[0] += c.Amount
		}
	case typeRef:
		if c.Amount > h.captured-h.refunded {
			reject()
			return
		}
		h.refunded += c.Amount
		a[0] += c.Amount
	}
}

// dbState is what the audit reads from Postgres.
type dbState struct {
	accounts     map[string][2]int64
	keys         map[string]string // key -> fingerprint
	keyKinds     map[string]string // key -> its kind in the partitioned layout
	doubleKeys   int
	rejections   map[string]bool
	pending, dea int
	processing   int // keys left PROCESSING
}

// readDB reads the state; with partitioned the keys come from the
// partitioned layout's tables (keys_test.go).
func readDB(ctx context.Context, pool *pgxpool.Pool, partitioned bool) (*dbState, error) {
	st := &dbState{accounts: map[string][2]int64{}, keys: map[string]string{}, keyKinds: map[string]string{}, rejections: map[string]bool{}}
	rows, err := pool.Query(ctx, `SELECT id, available, held FROM ledger.accounts`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var a [2]int64
		if err := rows.Scan(&id, &a[0], &a[1]); err != nil {
			return nil, err
		}
		st.accounts[id] = a
	}
	if rows.Err() != nil {
		return nil, rows.Err()
	}
	if partitioned {
		if err := readKeys2(ctx, pool, st); err != nil {
			return nil, err
		}
	} else {
		rows, err = pool.Query(ctx, `SELECT key, fingerprint FROM ledger.exactly_keys WHERE scope = 'ledger-consumer'`)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var k, fp string
			if err := rows.Scan(&k, &fp); err != nil {
				return nil, err
			}
			st.keys[k] = strings.TrimSpace(fp)
		}
		if rows.Err() != nil {
			return nil, rows.Err()
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT scope, key FROM ledger.exactly_keys GROUP BY scope, key HAVING count(*) > 1) d`).Scan(&st.doubleKeys); err != nil {
			return nil, err
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger.exactly_keys WHERE status = 'PROCESSING'`).Scan(&st.processing); err != nil {
			return nil, err
		}
	}
	rows, err = pool.Query(ctx, `SELECT command_id FROM ledger.rejections`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		st.rejections[id] = true
	}
	if rows.Err() != nil {
		return nil, rows.Err()
	}
	err = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'DEAD') FROM ledger.exactly_outbox`).Scan(&st.pending, &st.dea)
	return st, err
}

// findings is the audit's result: counts for the summary and every
// violation, described.
type findings struct {
	commands, copies, abortedRecs, committedTxnRecs int
	lostAccounts, doubledAccounts, wrongAccounts    int
	lostAmount, doubledAmount                       int64
	unapplied, phantom, abortedApplied              int
	missingEvents, extraEvents, strayEvents         int
	differingEvents                                 int // events whose copies differ
	deadLettered, dlqMissing, dlqUnexpected         int
	spreadAccounts, processing                      int
	problems                                        []string
}

func (f *findings) fail(kind string, format string, args ...any) {
	f.problems = append(f.problems, kind+": "+fmt.Sprintf(format, args...))
}

func fingerprint(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

type dlqKey struct{ uuid, payload string }

// audit compares the log (committed and uncommitted reads of the commands
// topic) with Postgres, the events topic and the dead-letter topic.
// restored says that the run restored the database to before its first
// position (restore_test.go): every command was applied again, in another
// interleaving of the partitions, so an event whose body carries state
// read when it was applied (the account's balance) may have copies that
// differ; they share the event's ID, which a consumer downstream applies
// once, and they are counted, not failed.
func audit(committed, all, events, dlq []rec, db *dbState, restored bool) *findings {
	f := &findings{}
	type pos struct {
		part int32
		off  int64
	}
	seen := map[pos]bool{}
	byKey := map[string][]rec{}
	var keyOrder []string
	for _, r := range committed {
		seen[pos{r.part, r.off}] = true
		if r.src == srcTxn {
			f.committedTxnRecs++
		}
		if _, ok := byKey[r.uuid]; !ok {
			keyOrder = append(keyOrder, r.uuid)
		}
		byKey[r.uuid] = append(byKey[r.uuid], r)
	}
	aborted := map[string]bool{}
	for _, r := range all {
		if !seen[pos{r.part, r.off}] {
			f.abortedRecs++
			if _, ok := byKey[r.uuid]; !ok {
				aborted[r.uuid] = true
			}
		}
	}
	type winner struct {
		c     command
		value []byte
		part  int32
		off   int64
	}
	var winners []winner
	winnerOf := map[string][]byte{}
	expectDLQ := map[dlqKey]string{} // -> "malformed" or "reused"
	for _, k := range keyOrder {
		rs := byKey[k]
		if k == "" {
			f.fail("harness", "%d records without a %s header", len(rs), kafkapubsub.UUIDHeader)
			continue
		}
		payloads := map[string][]rec{}
		var order []string
		for _, r := range rs {
			if _, ok := payloads[string(r.value)]; !ok {
				order = append(order, string(r.value))
			}
			payloads[string(r.value)] = append(payloads[string(r.value)], r)
		}
		f.copies += len(rs) - len(order)
		if _, ok := parse([]byte(order[0])); !ok {
			for _, p := range order {
				expectDLQ[dlqKey{k, p}] = "malformed"
			}
			continue
		}
		// The winner: with one payload, its first record; with several
		// (a key reused), the first on the partition that holds them all;
		// with several on more than one partition (the partition count
		// raised between them), the one the key row holds.
		w := rs[0]
		if len(order) > 1 && spansPartitions(rs) {
			var ok bool
			if w, ok = crossPartitionWinner(rs, db.keys[k]); !ok {
				w = rs[0] // the key-row check reports it
			}
		} else if len(order) > 1 {
			var common map[int32]bool
			for _, p := range order {
				ps := map[int32]bool{}
				for _, r := range payloads[p] {
					if common == nil || common[r.part] {
						ps[r.part] = true
					}
				}
				common = ps
			}
			var part int32 = -1
			for p := range common {
				part = p
			}
			if part < 0 {
				f.fail("harness", "key %s has different payloads on different partitions: the winner is not defined", k)
				continue
			}
			first := true
			for _, r := range rs {
				if r.part == part && (first || r.off < w.off) {
					w, first = r, false
				}
			}
		}
		for _, p := range order {
			if p != string(w.value) {
				expectDLQ[dlqKey{k, p}] = "reused"
			}
		}
		c, _ := parse(w.value)
		if c.CommandID != k {
			f.fail("harness", "record %s/%d carries uuid %s but command_id %s", "p", w.off, k, c.CommandID)
		}
		first := w
		for _, r := range payloads[string(w.value)] {
			if r.part < first.part || (r.part == first.part && r.off < first.off) {
				first = r
			}
		}
		winners = append(winners, winner{c: c, value: w.value, part: first.part, off: first.off})
		winnerOf[k] = w.value
	}
	f.commands = len(winners)
	sort.Slice(winners, func(i, j int) bool {
		if winners[i].part != winners[j].part {
			return winners[i].part < winners[j].part
		}
		return winners[i].off < winners[j].off
	})
	partsOf := map[string][]int32{}
	var cmds []command
	for _, w := range winners {
		cmds = append(cmds, w.c)
		for _, r := range byKey[w.c.CommandID] {
			if !slices.Contains(partsOf[w.c.Account], r.part) {
				partsOf[w.c.Account] = append(partsOf[w.c.Account], r.part)
			}
		}
	}
	// An account whose order-dependent commands are on several partitions
	// is applied as the worker decided (repartition_test.go).
	spread := spreadAccounts(cmds, partsOf)
	f.spreadAccounts = len(spread)
	m := &model{accounts: map[string]*[2]int64{}, holds: map[string]*holdState{}, rejected: map[string]bool{}}
	var decided []command
	for _, w := range winners {
		if spread[w.c.Account] {
			decided = append(decided, w.c)
			continue
		}
		m.apply(w.c)
	}
	bad := m.applyDecided(decided, db.rejections)
	for _, id := range slices.Sorted(maps.Keys(bad)) {
		f.wrongAccounts++
		f.fail("spread", "account %s (commands on partitions %v): %s", id, partsOf[id], strings.Join(bad[id], "; "))
	}

	// Balances.
	ids := map[string]bool{}
	for id := range m.accounts {
		ids[id] = true
	}
	for id := range db.accounts {
		ids[id] = true
	}
	var sorted []string
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Strings(sorted)
	for _, id := range sorted {
		var want [2]int64
		if a := m.accounts[id]; a != nil {
			want = *a
		}
		got := db.accounts[id]
		if got == want {
			continue
		}
		d := (got[0] + got[1]) - (want[0] + want[1])
		switch {
		case d < 0:
			f.lostAccounts++
			f.lostAmount -= d
		case d > 0:
			f.doubledAccounts++
			f.doubledAmount += d
		default:
			f.wrongAccounts++
		}
		f.fail("balance", "account %s: available/held %d/%d, recomputed %d/%d; its commands were on partitions %v", id, got[0], got[1], want[0], want[1], partsOf[id])
	}

	// Key rows.
	if db.doubleKeys > 0 {
		f.fail("keys", "%d keys have more than one row", db.doubleKeys)
	}
	for _, w := range winners {
		fp, ok := db.keys[w.c.CommandID]
		if !ok {
			f.unapplied++
			f.fail("keys", "command %s (%s %s) has no key row: never applied", w.c.CommandID, w.c.Type, w.c.Account)
			continue
		}
		if fp != fingerprint(w.value) {
			f.fail("keys", "command %s: the key row's fingerprint is not the first payload's (a key reuse was applied instead of its original)", w.c.CommandID)
		}
	}
	for k := range db.keys {
		if _, ok := winnerOf[k]; ok {
			continue
		}
		f.phantom++
		if aborted[k] {
			f.abortedApplied++
			f.fail("aborted", "command %s of an aborted transaction was applied (its key row exists)", k)
		} else {
			f.fail("keys", "key row %s belongs to no committed valid command", k)
		}
	}
	for id := range db.rejections {
		if !m.rejected[id] {
			f.fail("rejections", "command %s was rejected by the worker, but applies in the recomputation", id)
		}
	}
	for id := range m.rejected {
		if !db.rejections[id] {
			f.fail("rejections", "command %s is rejected in the recomputation, but the worker has no rejection for it", id)
		}
	}

	// Events: one per command (its UUID is "evt-" + the command's), copies
	// byte-identical, nothing else.
	evs := map[string][]rec{}
	for _, r := range events {
		evs[r.uuid] = append(evs[r.uuid], r)
	}
	for _, w := range winners {
		es := evs["evt-"+w.c.CommandID]
		if len(es) == 0 {
			f.missingEvents++
			f.fail("events", "command %s (%s %s) has no event", w.c.CommandID, w.c.Type, w.c.Account)
			continue
		}
		f.extraEvents += len(es) - 1
		for _, e := range es[1:] {
			if !bytes.Equal(e.value, es[0].value) {
				f.differingEvents++
				if !restored {
					f.fail("events", "event evt-%s has copies that differ: %s vs %s", w.c.CommandID, es[0].value, e.value)
				}
				break
			}
		}
		var ev struct {
			CommandID string `json:"command_id"`
			Type      string `json:"type"`
			Account   string `json:"account"`
			Outcome   string `json:"outcome"`
		}
		if err := json.Unmarshal(es[0].value, &ev); err != nil {
			f.fail("events", "event evt-%s is not JSON: %v", w.c.CommandID, err)
			continue
		}
		want := "applied"
		if m.rejected[w.c.CommandID] {
			want = "rejected"
		}
		if ev.CommandID != w.c.CommandID || ev.Account != w.c.Account || ev.Type != w.c.Type || ev.Outcome != want {
			f.fail("events", "event evt-%s says %s %s %s %s; the recomputation says %s %s %s", w.c.CommandID, ev.CommandID, ev.Type, ev.Account, ev.Outcome, w.c.Type, w.c.Account, want)
		}
	}
	for u, es := range evs {
		if _, ok := winnerOf[strings.TrimPrefix(u, "evt-")]; !ok || !strings.HasPrefix(u, "evt-") {
			f.strayEvents += len(es)
			what := "no committed valid command"
			if aborted[strings.TrimPrefix(u, "evt-")] {
				what = "a command of an aborted transaction"
			}
			f.fail("events", "event %s (%d copies) belongs to %s", u, len(es), what)
		}
	}

	// Dead letters: exactly the malformed records and the key reuses, each
	// with a reason.
	got := map[dlqKey][]rec{}
	for _, r := range dlq {
		got[dlqKey{r.uuid, string(r.value)}] = append(got[dlqKey{r.uuid, string(r.value)}], r)
	}
	f.deadLettered = len(got)
	for k, kind := range expectDLQ {
		rs, ok := got[k]
		if !ok {
			f.dlqMissing++
			f.fail("dlq", "%s record %s %q is not on the dead-letter topic", kind, k.uuid, trunc(k.payload))
			continue
		}
		want := "malformed"
		if kind == "reused" {
			want = "reused"
		}
		if !strings.Contains(rs[0].reason, want) {
			f.fail("dlq", "%s record %s has reason %q (want one that says %q)", kind, k.uuid, rs[0].reason, want)
		}
	}
	for k, rs := range got {
		if _, ok := expectDLQ[k]; ok {
			continue
		}
		f.dlqUnexpected++
		what := "a record that is neither malformed nor a key reuse"
		switch {
		case aborted[k.uuid]:
			what = "a record of an aborted transaction"
		case k.uuid == "" && isControlRecord([]byte(k.payload)):
			what = "a transaction marker (control record), delivered as a message,"
		}
		f.fail("dlq", "%s is dead-lettered: %s %q (reason %q)", what, k.uuid, trunc(k.payload), rs[0].reason)
	}
	if f.processing = db.processing; db.processing > 0 {
		f.fail("keys", "%d keys are still PROCESSING after the drain", db.processing)
	}
	if db.pending > 0 || db.dea > 0 {
		f.fail("outbox", "%d events still pending and %d DEAD in the outbox after the drain", db.pending, db.dea)
	}
	return f
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// isControlRecord reports whether b looks like the value of a transaction
// marker: int16 version 0, int32 coordinator epoch.
func isControlRecord(b []byte) bool {
	return len(b) == 6 && b[0] == 0 && b[1] == 0
}
