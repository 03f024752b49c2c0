package workertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// The assertions wait until the worker has caught up ([Kit.WaitCaughtUp]),
// then report every difference with t.Errorf (the test goes on) and return
// whether there was none.

// AssertRows runs query on the kit's schema and compares its rows with
// want, in order: each row is its columns' values printed with fmt.Sprint
// and separated by one space ("acc-1 15"). Order the rows (ORDER BY) when
// their order is not fixed.
func (k *Kit) AssertRows(query string, want ...string) bool {
	k.t.Helper()
	k.WaitCaughtUp()
	got, err := k.Rows(query)
	if err != nil {
		k.t.Errorf("workertest: AssertRows: %v\n%s", err, query)
		return false
	}
	if slices.Equal(got, want) {
		return true
	}
	k.t.Errorf("workertest: %s\ngot rows:\n%s\nwant:\n%s", query, lines(got), lines(want))
	return false
}

// Rows runs query on the kit's schema and returns its rows as AssertRows
// prints them.
func (k *Kit) Rows(query string, args ...any) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Timeout)
	defer cancel()
	rows, err := k.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		cols := make([]string, len(vals))
		for i, v := range vals {
			cols[i] = fmt.Sprint(v)
		}
		out = append(out, strings.Join(cols, " "))
	}
	return out, rows.Err()
}

// AssertAppliedOnce checks that every command sent (each distinct ID)
// was applied exactly once, as the user's rows record it: query returns
// one row per application, the command's ID in its first column (a
// journal: "SELECT command_id FROM entries"). The commands in except
// (bad payloads, say) must not have been applied at all. A row whose ID
// was never sent is reported too.
func (k *Kit) AssertAppliedOnce(query string, except ...string) bool {
	k.t.Helper()
	k.WaitCaughtUp()
	applied, err := k.firstColumn(query)
	if err != nil {
		k.t.Errorf("workertest: AssertAppliedOnce: %v\n%s", err, query)
		return false
	}
	ok := true
	seen := map[string]bool{}
	for _, c := range k.Sent() {
		if c.ID == "" || seen[c.ID] {
			continue
		}
		seen[c.ID] = true
		want := 1
		if slices.Contains(except, c.ID) {
			want = 0
		}
		if n := applied[c.ID]; n != want {
			k.t.Errorf("workertest: command %s applied %d times, want %d (%s)", c.ID, n, want, query)
			ok = false
		}
	}
	for _, id := range sortedCounts(applied) {
		if !seen[id] {
			k.t.Errorf("workertest: %q applied %d times but never sent (%s): the query's first column must be the command's ID", id, applied[id], query)
			ok = false
		}
	}
	return ok
}

// AssertOutputs checks that the outputs topic holds exactly one record with
// each of these message IDs and no other record, and that no output is
// DEAD in the outbox (given up on by the relay). A command applied twice
// shows here as an output twice (or two outputs) when its outputs' IDs
// derive from the command's.
func (k *Kit) AssertOutputs(ids ...string) bool {
	k.t.Helper()
	ok := k.assertIDs("outputs", k.Outputs(), ids)
	dead, err := k.Rows("SELECT uuid FROM exactly_outbox WHERE status = 'DEAD' ORDER BY id")
	if err != nil {
		k.t.Errorf("workertest: AssertOutputs: read exactly_outbox: %v", err)
		return false
	}
	if len(dead) > 0 {
		k.t.Errorf("workertest: %d output(s) DEAD in the outbox, never published: %q", len(dead), dead)
		return false
	}
	return ok
}

// AssertDeadLetters checks that the dead-letter topic holds exactly these
// message IDs, in any order, an ID given n times on n records. A command
// refused for good is dead-lettered on each delivery, since no key keeps
// it: sent twice, or replayed ([Kit.Replay]), it is there twice. A record
// sent without an ID has "" here.
func (k *Kit) AssertDeadLetters(ids ...string) bool {
	k.t.Helper()
	return k.assertIDs("dead-letter", k.DeadLetters(), ids)
}

func (k *Kit) assertIDs(topic string, recs []Record, want []string) bool {
	k.t.Helper()
	got := make([]string, len(recs))
	for i, r := range recs {
		got[i] = r.ID
	}
	slices.Sort(got)
	want = slices.Sorted(slices.Values(want))
	if slices.Equal(got, want) {
		return true
	}
	var detail strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&detail, "  %d/%d id=%q key=%q", r.Partition, r.Offset, r.ID, r.Key)
		if r.Reason != "" {
			fmt.Fprintf(&detail, " reason=%q", r.Reason)
		}
		fmt.Fprintf(&detail, " %q\n", r.Payload)
	}
	k.t.Errorf("workertest: the %s topic holds IDs %q, want %q; its records:\n%s", topic, got, want, detail.String())
	return false
}

// firstColumn counts the values of query's first column.
func (k *Kit) firstColumn(query string) (map[string]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Timeout)
	defer cancel()
	rows, err := k.pool.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		if len(vals) == 0 {
			return nil, fmt.Errorf("the query returns no column: return the command's ID first")
		}
		out[fmt.Sprint(vals[0])]++
	}
	return out, rows.Err()
}

func lines(rows []string) string {
	if len(rows) == 0 {
		return "  (none)"
	}
	return "  " + strings.Join(rows, "\n  ")
}

func sortedCounts(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
