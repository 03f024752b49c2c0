package pgstore

import (
	"context"
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
// statement that has none (made elsewhere) falls back to pgx.NamedArgs.
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
	forms := map[string]queries{
		"parent":    newPartitionedQueries(`"s"."exactly_keys2"`, `"s"."names"`, "", ""),
		"legacy":    newPartitionedQueries(`"s"."exactly_keys2"`, `"s"."names"`, `"s"."exactly_keys"`, ""),
		"partition": newPartitionedQueries(`"s"."exactly_keys2_p1"`, `"s"."names"`, "", p.attachedGuard("exactly_keys2_p1")),
	}
	mores := []pgx.NamedArgs{nil, {"result": []byte("r")}, {"attempts": 2, "result": []byte("r"), "ttl": 9e6}, {"attempts": 3, "lease": 1e6}}
	ctx := context.Background()
	for name, q := range forms {
		a := a
		a.q = &q
		stmts := map[string]string{"claim": q.claim, "claimNew": q.claimNew, "lock": q.lock, "takeover": q.takeover, "result": q.result,
			"complete": q.complete, "release": q.release, "extend": q.extend, "get": q.get, "resultOne": q.resultOne,
			"elsewhere": "SELECT @kid::uuid, @tname::text, @nope::int"}
		for sname, stmt := range stmts {
			if _, ok := q.positional[stmt]; !ok && sname != "elsewhere" {
				t.Errorf("%s %s: no positional form", name, sname)
			}
			for _, more := range mores {
				wantSQL, wantArgs, err := full(more).RewriteQuery(ctx, nil, stmt, nil)
				if err != nil {
					t.Fatal(err)
				}
				gotSQL, gotArgs, err := (&partNamed{a: &a, more: more}).RewriteQuery(ctx, nil, stmt, nil)
				if err != nil {
					t.Fatalf("%s %s: %v", name, sname, err)
				}
				if gotSQL != wantSQL || !reflect.DeepEqual(gotArgs, wantArgs) {
					t.Errorf("%s %s with %v:\n got %q %#v\nwant %q %#v", name, sname, more, gotSQL, gotArgs, wantSQL, wantArgs)
				}
			}
		}
	}
}
