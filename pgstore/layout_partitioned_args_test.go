package pgstore

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// TestPartNamedAsNamedArgs: every named statement of the partitioned
// layout, in each of its forms (on the partitioned table, with the legacy
// table probed, on a guarded time partition), is sent with the SQL and the
// arguments pgx.NamedArgs would send, from its positional form; a
// statement made elsewhere falls back to pgx.NamedArgs.
func TestPartNamedAsNamedArgs(t *testing.T) {
	topic, part, off, text := "orders", int32(3), int64(42), "0:/k-1"
	a := claimArgs{scope: "s", id: "k-1", fingerprint: strings.Repeat("ab", 32), status: dedupe.StatusProcessing,
		topic: &topic, partition: &part, offset: &off, leaseMicros: 5e6, ttlMicros: 7e6,
		part: &partArgs{sid: storedID{kid: [16]byte{1, 2, 3}, kind: 't', text: &text}, scopeCode: 7, topicCode: new(int16), fp: []byte{0xab}},
	}
	*a.part.topicCode = 9
	full := func(more pgx.NamedArgs) pgx.NamedArgs {
		pa := a.part
		n := pgx.NamedArgs{
			"scope": a.scope, "id": a.id, "fp": pa.fp, "status": string(a.status), "topic": pa.topicCode, "part": a.partition,
			"off": a.offset, "lease": a.leaseMicros, "ttl": a.ttlMicros, "scode": pa.scopeCode, "kid": kidArg(pa.sid.kid),
			"kind": string(pa.sid.kind), "idtext": pa.sid.text, "tname": a.topic,
		}
		for k, v := range more {
			n[k] = v
		}
		return n
	}
	p := &partitioned{table: "exactly_keys2"}
	type form struct{ parent, legacy, guard string }
	forms := map[string]form{
		"parent":    {`"s"."exactly_keys2"`, "", ""},
		"legacy":    {`"s"."exactly_keys2"`, `"s"."exactly_keys"`, ""},
		"partition": {`"s"."exactly_keys2_p1"`, "", p.attachedGuard("exactly_keys2_p1")},
	}
	mores := []pgx.NamedArgs{nil, {"result": []byte("r")}, {"attempts": 2, "result": []byte("r"), "ttl": 9e6}, {"attempts": 3, "lease": 1e6}}
	ctx := context.Background()
	stmts := func(q *queries) map[string]string {
		return map[string]string{"claim": q.claim, "claimNew": q.claimNew, "lock": q.lock, "takeover": q.takeover, "result": q.result,
			"complete": q.complete, "release": q.release, "extend": q.extend, "get": q.get, "resultOne": q.resultOne}
	}
	for name, f := range forms {
		named := newPartitionedNamedQueries(f.parent, `"s"."names"`, f.legacy, f.guard)
		q := newPartitionedQueries(f.parent, `"s"."names"`, f.legacy, f.guard)
		a := a
		a.q = &q
		sent := stmts(&q)
		for sname, stmt := range stmts(&named) {
			if _, ok := q.positional[sent[sname]]; !ok {
				t.Errorf("%s %s: not numbered", name, sname)
			}
			for _, more := range mores {
				wantSQL, wantArgs, err := full(more).RewriteQuery(ctx, nil, stmt, nil)
				if err != nil {
					t.Fatal(err)
				}
				gotSQL, gotArgs, err := (&partNamed{a: &a, more: more}).RewriteQuery(ctx, nil, sent[sname], nil)
				if err != nil {
					t.Fatalf("%s %s: %v", name, sname, err)
				}
				if gotSQL != wantSQL || !reflect.DeepEqual(gotArgs, wantArgs) {
					t.Errorf("%s %s with %v:\n got %q %#v\nwant %q %#v", name, sname, more, gotSQL, gotArgs, wantSQL, wantArgs)
				}
			}
		}
		// A statement made elsewhere goes through pgx.NamedArgs.
		const elsewhere = "SELECT @kid::uuid, @tname::text, @nope::int"
		for _, more := range mores {
			wantSQL, wantArgs, _ := full(more).RewriteQuery(ctx, nil, elsewhere, nil)
			gotSQL, gotArgs, err := (&partNamed{a: &a, more: more}).RewriteQuery(ctx, nil, elsewhere, nil)
			if err != nil || gotSQL != wantSQL || !reflect.DeepEqual(gotArgs, wantArgs) {
				t.Errorf("%s elsewhere: got %q %#v %v, want %q %#v", name, gotSQL, gotArgs, err, wantSQL, wantArgs)
			}
		}
	}
	// A tracer sees the arguments by name, as it saw pgx.NamedArgs.
	if got, want := fmt.Sprint(&partNamed{a: &a}), fmt.Sprint(map[string]any(full(nil))); got != want {
		t.Errorf("partNamed prints %s, want %s", got, want)
	}
}

// TestQueriesCacheBounded: the sets of statements a partitioned layout
// keeps, one for each partition a claim names, stay bounded as partitions
// come and go, and a set made again is the same.
func TestQueriesCacheBounded(t *testing.T) {
	p := &partitioned{table: "exactly_keys2", parent: `"s"."exactly_keys2"`, names: `"s"."names"`, qs: map[[2]string]*queries{}}
	first := *p.queriesFor(layoutState{}, "exactly_keys2_p0")
	for i := range 3 * maxCachedQueries {
		p.queriesFor(layoutState{}, fmt.Sprintf("exactly_keys2_p%d", i))
		if len(p.qs) > maxCachedQueries {
			t.Fatalf("%d sets of statements kept after %d partitions, want at most %d", len(p.qs), i+1, maxCachedQueries)
		}
	}
	if again := *p.queriesFor(layoutState{}, "exactly_keys2_p0"); !reflect.DeepEqual(again, first) {
		t.Errorf("the statements of a partition made again differ:\n%+v\n%+v", again, first)
	}
}
