package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/internal/kafkaadmin"
)

// The partitions-raised fault: the commands topic's partition count raised
// while the workers consume. Kafka's default partitioner maps a key to its
// hash modulo the partition count, so from then on the producers write
// most accounts to another partition than before: one account's commands
// sit on two partitions (three after a second raise), consumed in no
// defined order relative to each other, and an exact copy or a key reuse
// produced after the raise lands on another partition than its original.
// The workers' consumer group watches the topic's partitions
// (kafkapubsub's WatchPartitionChanges) and must take the new ones; the
// recovery is the time from the raise until everything written to the new
// partitions by then is committed.

// raiseStep is how many partitions each partitions-raised fault adds.
const raiseStep = 2

// partCount is the commands topic's partition count once it was raised
// past partitions; zero until then.
type partCount struct{ n atomic.Int32 }

// commandParts is the commands topic's partition count as the run knows it.
func (m *monitor) commandParts() int {
	if n := int(m.parts.n.Load()); n > partitions {
		return n
	}
	return partitions
}

// raisePartitions injects one partitions-raised fault.
func (r *topoRun) raisePartitions(ctx context.Context, c *chaosRun) {
	const kind = "partitions-raised"
	start := time.Now()
	if err := r.waitReplicated(ctx, 3*time.Minute); err != nil {
		c.t.Error(err)
		return
	}
	// A group that is rebalancing anyway (a killed worker's replacement
	// joining) would take the new partitions without watching for them:
	// the raise comes once every worker is a member of a stable group.
	stable := r.waitGroupStable(ctx, c, 90*time.Second)
	from := c.mon.commandParts()
	to := from + raiseStep
	at := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	res, err := r.kc.CreatePartitions(cctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: commandsTopic, Count: int32(to)}}})
	cancel()
	if err == nil {
		err = res.Errors[commandsTopic]
	}
	if err != nil {
		c.t.Errorf("chaos: raise %s from %d to %d partitions: %v", commandsTopic, from, to, err)
		return
	}
	if err := r.waitPartitions(ctx, to, time.Minute); err != nil {
		c.t.Error(err)
		return
	}
	c.mon.parts.n.Store(int32(to))
	// The producer learns of the new partitions on its next metadata
	// refresh (every five minutes by default): ask for one now, so the
	// batch below and the stream after it use them.
	for deadline := time.Now().Add(time.Minute); ; {
		r.prodCl.ForceMetadataRefresh()
		if _, _, err := r.prodCl.PartitionLeader(commandsTopic, int32(to-1)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			c.t.Errorf("chaos: the producer does not see partition %d of %s a minute after the raise", to-1, commandsTopic)
			return
		}
		time.Sleep(200 * time.Millisecond) // poll: the refresh is asynchronous
	}
	// A batch of top-ups, so the new partitions have work; again (after
	// another refresh) while none of it reached them, up to five times.
	var batch []*kgo.Record
	onNew := 0
	for try := 0; try < 5 && onNew == 0; try++ {
		if try > 0 {
			r.prodCl.ForceMetadataRefresh()
			time.Sleep(time.Second) // the refresh is asynchronous
		}
		b, ok := r.workBatch(ctx, c, "after "+kind)
		if !ok {
			return
		}
		for _, rec := range b {
			if int(rec.Partition) >= from {
				onNew++
			}
		}
		batch = append(batch, b...)
	}
	// Everything on the new partitions at this point must be committed.
	ectx, ecancel := context.WithTimeout(ctx, 10*time.Second)
	ends, err := kafkaadmin.EndOffsets(ectx, r.kc, commandsTopic, to)
	ecancel()
	if err != nil {
		c.t.Errorf("chaos: end offsets after %s: %v", kind, err)
		return
	}
	base := map[int]int64{}
	for p := from; p < to; p++ {
		if ends[p] > 0 {
			base[p] = ends[p] - 1
		}
	}
	d, ok := time.Duration(0), true
	if len(base) > 0 {
		d, ok = c.mon.progressed(ctx, base, at, 2*time.Minute)
		if ok {
			r.recovered[kind] = append(r.recovered[kind], d)
		} else {
			r.unrecov[kind]++
			c.t.Errorf("chaos: %s: the new partitions %d-%d of %s were not consumed within 2m (committed below %v)", kind, from, to-1, commandsTopic, ends)
		}
	} else {
		c.t.Errorf("chaos: %s: no record of the batch reached the new partitions %d-%d", kind, from, to-1)
	}
	r.done[kind]++
	rec := "nothing written to them"
	switch {
	case len(base) > 0 && ok:
		rec = "committed after " + d.Round(100*time.Millisecond).String()
	case len(base) > 0:
		rec = "NOT consumed within 2m"
	}
	if !stable {
		rec += " (the group was not stable before the raise)"
	}
	line := fmt.Sprintf("%s %d→%d partitions (%d of the batch's %d records on the new ones): %s, fault took %s", kind, from, to, onNew, len(batch), rec,
		time.Since(start).Round(100*time.Millisecond))
	r.timeline = append(r.timeline, line)
	c.t.Logf("chaos-topology: %s", line)
}

// waitPartitions waits until the cluster's metadata shows n partitions of
// the commands topic, each with a leader.
func (r *topoRun) waitPartitions(ctx context.Context, n int, d time.Duration) error {
	deadline := time.Now().Add(d)
	have := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		lead, err := r.leaders(ctx, commandsTopic)
		if err == nil {
			have = 0
			for _, l := range lead {
				if l >= 0 {
					have++
				}
			}
			if have >= n {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond) // poll: the controller creates them
	}
	return fmt.Errorf("chaos: %s has %d partitions with a leader, not %d, %v after the raise", commandsTopic, have, n, d)
}

// orderDependent reports whether a command's outcome depends on what was
// applied before it (everything but a top-up).
func orderDependent(c command) bool { return c.Type != typeTopup }

// spreadAccounts returns the accounts with an order-dependent command
// whose commands' records (copies included) are on more than one
// partition: the order in which the worker applied them is not the log's.
func spreadAccounts(cmds []command, partsOf map[string][]int32) map[string]bool {
	out := map[string]bool{}
	for _, c := range cmds {
		if orderDependent(c) && len(partsOf[c.Account]) > 1 {
			out[c.Account] = true
		}
	}
	return out
}

// crossPartitionWinner picks, for a key whose payloads (a key reuse) are on
// more than one partition, the payload the worker applied: the one whose
// fingerprint the key row holds. Which of them reached the worker first is
// not defined by the log.
func crossPartitionWinner(rs []rec, fp string) (rec, bool) {
	for _, r := range rs {
		if fingerprint(r.value) == fp {
			return r, true
		}
	}
	return rec{}, false
}

// applyDecided applies the commands of the spread accounts as the worker
// decided them (its rejections, from Postgres), holds first, since the
// log's order is not the order of application across partitions; and
// returns, by account, what breaks the ledger's rules in any order: a
// top-up rejected, a capture, release or refund of a hold that was never
// applied, a hold applied twice, more captured and released than held,
// more refunded than captured, a negative balance.
func (m *model) applyDecided(cmds []command, rejected map[string]bool) map[string][]string {
	bad := map[string][]string{}
	spread := map[string]bool{}
	for pass := 0; pass < 2; pass++ {
		for _, c := range cmds {
			if (c.Type == typeHold) != (pass == 0) {
				continue
			}
			spread[c.Account] = true
			if rejected[c.CommandID] && c.Type != typeTopup {
				m.rejected[c.CommandID] = true
				continue
			}
			a := m.acct(c.Account)
			switch c.Type {
			case typeTopup:
				if rejected[c.CommandID] {
					bad[c.Account] = append(bad[c.Account], fmt.Sprintf("top-up %s rejected", c.CommandID))
				}
				a[0] += c.Amount
			case typeHold:
				if _, ok := m.holds[c.HoldID]; ok {
					bad[c.Account] = append(bad[c.Account], fmt.Sprintf("hold %s applied twice (command %s)", c.HoldID, c.CommandID))
					continue
				}
				a[0] -= c.Amount
				a[1] += c.Amount
				m.holds[c.HoldID] = &holdState{account: c.Account, amount: c.Amount}
			default:
				h, ok := m.holds[c.HoldID]
				if !ok || h.account != c.Account {
					bad[c.Account] = append(bad[c.Account], fmt.Sprintf("%s %s of hold %s applied, but the hold was not", c.Type, c.CommandID, c.HoldID))
					continue
				}
				switch c.Type {
				case typeCapt:
					a[1] -= c.Amount
					h.captured += c.Amount
				case typeRel:
					a[1] -= c.Amount
					a[0] += c.Amount
					h.released += c.Amount
				case typeRef:
					a[0] += c.Amount
					h.refunded += c.Amount
				}
			}
		}
	}
	for id, h := range m.holds {
		if !spread[h.account] {
			continue
		}
		if h.captured+h.released > h.amount {
			bad[h.account] = append(bad[h.account], fmt.Sprintf("hold %s of %d: %d captured and %d released", id, h.amount, h.captured, h.released))
		}
		if h.refunded > h.captured {
			bad[h.account] = append(bad[h.account], fmt.Sprintf("hold %s: %d refunded of %d captured", id, h.refunded, h.captured))
		}
	}
	for id := range spread {
		if a := m.acct(id); a[0] < 0 || a[1] < 0 {
			bad[id] = append(bad[id], fmt.Sprintf("available/held %d/%d", a[0], a[1]))
		}
	}
	return bad
}

// topoExtra is the topology run's audit figures beyond the single-broker
// run's, for the summary line.
func topoExtra(f *findings) string {
	return fmt.Sprintf(" spread-accounts=%d processing=%d", f.spreadAccounts, f.processing)
}

func TestApplyDecided(t *testing.T) {
	cmds := []command{
		{CommandID: "c1", Type: typeCapt, Account: "a-1", Amount: 5, HoldID: "h1"}, // before its hold in the log's order
		{CommandID: "t1", Type: typeTopup, Account: "a-1", Amount: 10},
		{CommandID: "h1", Type: typeHold, Account: "a-1", Amount: 8, HoldID: "h1"},
		{CommandID: "r1", Type: typeRel, Account: "a-1", Amount: 3, HoldID: "h1"},
		{CommandID: "x1", Type: typeRef, Account: "a-1", Amount: 9, HoldID: "h1"}, // rejected by the worker
	}
	m := &model{accounts: map[string]*[2]int64{}, holds: map[string]*holdState{}, rejected: map[string]bool{}}
	if bad := m.applyDecided(cmds, map[string]bool{"x1": true}); len(bad) != 0 {
		t.Fatalf("valid decisions: %v", bad)
	}
	if got := *m.accounts["a-1"]; got != [2]int64{5, 0} || !m.rejected["x1"] {
		t.Fatalf("a-1 = %v, rejected %v; want [5 0] and x1 rejected", got, m.rejected)
	}
	// The refund applied: more refunded than captured.
	m = &model{accounts: map[string]*[2]int64{}, holds: map[string]*holdState{}, rejected: map[string]bool{}}
	bad := m.applyDecided(cmds, nil)
	if len(bad["a-1"]) != 1 || !strings.Contains(bad["a-1"][0], "9 refunded of 5 captured") {
		t.Fatalf("refund past the capture: %v", bad)
	}
	// A capture of a hold the worker rejected.
	m = &model{accounts: map[string]*[2]int64{}, holds: map[string]*holdState{}, rejected: map[string]bool{}}
	bad = m.applyDecided(cmds[:3], map[string]bool{"h1": true})
	if len(bad["a-1"]) != 1 || !strings.Contains(bad["a-1"][0], "the hold was not") {
		t.Fatalf("capture without its hold: %v", bad)
	}
}

// TestAuditSpread checks the audit on an account whose commands the
// partitions-raised fault spread over two partitions, and a key reused
// across them: the worker's decisions are taken as the order, and a
// balance that no order explains is still a problem.
func TestAuditSpread(t *testing.T) {
	val := func(c command) []byte {
		return []byte(fmt.Sprintf(`{"command_id":%q,"type":%q,"account":%q,"amount":%d%s}`, c.CommandID, c.Type, c.Account, c.Amount, holdField(c)))
	}
	t1 := command{CommandID: "t1", Type: typeTopup, Account: "a-1", Amount: 10}
	h1 := command{CommandID: "h1", Type: typeHold, Account: "a-1", Amount: 8, HoldID: "h1"}
	c1 := command{CommandID: "c1", Type: typeCapt, Account: "a-1", Amount: 5, HoldID: "h1"}
	reuse := command{CommandID: "t2", Type: typeTopup, Account: "a-1", Amount: 7}
	orig := command{CommandID: "t2", Type: typeTopup, Account: "a-1", Amount: 4}
	// The log: t1, h1 and t2 on partition 0; c1 and a reuse of t2 on
	// partition 6 (after the raise), which the worker reached first: c1 was
	// rejected (its hold not applied yet), the reuse won.
	committed := []rec{
		{part: 0, off: 0, uuid: "t1", value: val(t1)}, {part: 0, off: 1, uuid: "h1", value: val(h1)}, {part: 0, off: 2, uuid: "t2", value: val(orig)},
		{part: 6, off: 0, uuid: "c1", value: val(c1)}, {part: 6, off: 1, uuid: "t2", value: val(reuse)},
	}
	events := []rec{}
	for _, c := range []command{t1, h1, c1, reuse} {
		outcome := "applied"
		if c.CommandID == "c1" {
			outcome = "rejected"
		}
		events = append(events, rec{uuid: "evt-" + c.CommandID, value: []byte(fmt.Sprintf(`{"command_id":%q,"type":%q,"account":%q,"outcome":%q}`, c.CommandID, c.Type, c.Account, outcome))})
	}
	dlq := []rec{{uuid: "t2", value: val(orig), reason: "key reused"}}
	db := &dbState{accounts: map[string][2]int64{"a-1": {9, 8}}, rejections: map[string]bool{"c1": true},
		keys: map[string]string{"t1": fingerprint(val(t1)), "h1": fingerprint(val(h1)), "c1": fingerprint(val(c1)), "t2": fingerprint(val(reuse))}}
	f := audit(committed, committed, events, dlq, db, false)
	if len(f.problems) != 0 || f.spreadAccounts != 1 {
		t.Fatalf("spread account, worker's order: spread %d, problems %q", f.spreadAccounts, f.problems)
	}
	// A key left PROCESSING after the drain.
	db.processing = 1
	if f := audit(committed, committed, events, dlq, db, false); f.processing != 1 || !slices.ContainsFunc(f.problems, func(p string) bool { return strings.Contains(p, "PROCESSING") }) {
		t.Fatalf("a key left PROCESSING: processing %d, problems %q", f.processing, f.problems)
	}
	db.processing = 0
	// A balance no order explains: 1 more available.
	db.accounts["a-1"] = [2]int64{10, 8}
	if f := audit(committed, committed, events, dlq, db, false); f.doubledAccounts != 1 {
		t.Fatalf("doubled = %d, problems %q; want the account doubled", f.doubledAccounts, f.problems)
	}
	// A key row for neither payload of the reused key.
	db.accounts["a-1"] = [2]int64{9, 8}
	db.keys["t2"] = "beef"
	if f := audit(committed, committed, events, dlq, db, false); !slices.ContainsFunc(f.problems, func(p string) bool { return strings.Contains(p, "t2") }) {
		t.Fatalf("a key row for neither payload: problems %q", f.problems)
	}
}

func holdField(c command) string {
	if c.HoldID == "" {
		return ""
	}
	return fmt.Sprintf(`,"hold_id":%q`, c.HoldID)
}

// spansPartitions reports whether rs are on more than one partition.
func spansPartitions(rs []rec) bool {
	for _, r := range rs {
		if r.part != rs[0].part {
			return true
		}
	}
	return false
}

// waitGroupStable waits until the workers' group is stable with every
// running worker a member and the commands topic's partitions assigned,
// then two seconds more; it reports whether that happened within d.
func (r *topoRun) waitGroupStable(ctx context.Context, c *chaosRun, d time.Duration) bool {
	var since time.Time
	for deadline := time.Now().Add(d); time.Now().Before(deadline) && ctx.Err() == nil; {
		c.ws.mu.Lock()
		total := len(c.ws.all)
		c.ws.mu.Unlock()
		ok := len(c.targets()) == total
		if ok {
			g, err := describeGroup(ctx, r.brokers)
			ok = err == nil && g.stable && g.members == total && g.assigned == c.mon.commandParts()
		}
		switch {
		case !ok:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= 2*time.Second:
			return true
		}
		time.Sleep(200 * time.Millisecond) // poll: a worker may be joining
	}
	return false
}

// group is what describeGroup reads of the workers' group.
type groupView struct {
	stable            bool
	members, assigned int // assigned: the commands topic's partitions
	static            int // members with an instance ID
	protocol          string
}

// describeGroup describes the workers' group with franz-go's messages,
// which read the member assignments of every classic-protocol assignor
// (kafka-go's client cannot read the cooperative-sticky assignor's).
func describeGroup(ctx context.Context, brokers []string) (groupView, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return groupView{}, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return groupView{}, err
	}
	if len(resp.Groups) != 1 {
		return groupView{}, fmt.Errorf("chaos: %d groups described", len(resp.Groups))
	}
	g := resp.Groups[0]
	if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
		return groupView{}, err
	}
	v := groupView{stable: g.State == "Stable", members: len(g.Members), protocol: g.Protocol}
	for _, m := range g.Members {
		if m.InstanceID != nil {
			v.static++
		}
		if len(m.MemberAssignment) == 0 {
			continue // a member the leader gave nothing (more members than partitions)
		}
		var a kmsg.ConsumerMemberAssignment
		if err := a.ReadFrom(m.MemberAssignment); err != nil {
			return groupView{}, fmt.Errorf("chaos: member %s's assignment: %w", m.MemberID, err)
		}
		for _, t := range a.Topics {
			if t.Topic == commandsTopic {
				v.assigned += len(t.Partitions)
			}
		}
	}
	return v, nil
}
