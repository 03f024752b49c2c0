package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// The partitioned layout's statements name their arguments (@scope, @kid,
// ...). pgx.NamedArgs would parse a statement at each execution to number
// them, which cost a request a tenth of the middleware's own CPU in
// BenchmarkMiddleware: each statement is numbered once instead, when its
// queries are made (numberArgs), and its arguments are listed in that
// order at each execution (partNamed).

// argNames are the names the partitioned layout's statements use.
var argNames = []string{"scope", "id", "fp", "status", "topic", "part", "off", "lease", "ttl",
	"scode", "kid", "kind", "idtext", "tname", "attempts", "result"}

// numberArgs replaces each statement of stmts with its positional form,
// numbered as pgx.NamedArgs numbers it, and returns the names of each
// positional form's arguments, in order, by its text (which the map shares
// with the statement, so that the queries cached for every partition keep
// one text of each). A statement that names an argument not in argNames
// is left as it is, and goes through pgx.NamedArgs at each execution
// (TestPartNamedAsNamedArgs checks that none does).
func numberArgs(stmts ...*string) map[string][]string {
	all := make(pgx.NamedArgs, len(argNames))
	for _, n := range argNames {
		all[n] = n
	}
	m := make(map[string][]string, len(stmts))
stmts:
	for _, stmt := range stmts {
		if *stmt == "" {
			continue
		}
		sql, args, err := all.RewriteQuery(context.Background(), nil, *stmt, nil)
		if err != nil {
			continue
		}
		names := make([]string, len(args))
		for i, a := range args {
			name, ok := a.(string)
			if !ok {
				continue stmts
			}
			names[i] = name
		}
		*stmt = sql
		m[sql] = internNames(names)
	}
	return m
}

// argOrders holds each distinct order of argument names once, for the
// statements of every partition (numberArgs).
var argOrders sync.Map // strings.Join(names, ",") -> []string

func internNames(names []string) []string {
	v, _ := argOrders.LoadOrStore(strings.Join(names, ","), names)
	return v.([]string)
}

// partNamed is the arguments of one statement on a key (a claim's, or an
// update's with more), as a pgx.QueryRewriter: it lists them in the order
// of the statement's positional form (queries.positional), and falls back
// to pgx.NamedArgs for a statement that is not one.
type partNamed struct {
	a    *claimArgs
	more pgx.NamedArgs
}

// RewriteQuery implements pgx.QueryRewriter.
func (n *partNamed) RewriteQuery(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	var names []string
	ok := false
	if n.a.q != nil {
		names, ok = n.a.q.positional[sql]
	}
	if !ok {
		return n.named().RewriteQuery(ctx, conn, sql, args)
	}
	out := make([]any, len(names))
	for i, name := range names {
		out[i], _ = n.value(name) // nil when missing, as with pgx.NamedArgs
	}
	return sql, out, nil
}

// String shows the arguments by name, as pgx.NamedArgs did to a tracer or
// a query logger (which see the arguments before they are numbered).
func (n *partNamed) String() string { return fmt.Sprint(map[string]any(n.named())) }

// named is every argument by its name.
func (n *partNamed) named() pgx.NamedArgs {
	all := make(pgx.NamedArgs, len(argNames))
	for _, name := range argNames {
		if v, ok := n.value(name); ok {
			all[name] = v
		}
	}
	return all
}

// value is the argument name: more's, else the claim's.
func (n *partNamed) value(name string) (any, bool) {
	if v, ok := n.more[name]; ok {
		return v, true
	}
	a, pa := n.a, n.a.part
	switch name {
	case "scope":
		return a.scope, true
	case "id":
		return a.id, true
	case "fp":
		return pa.fp, true
	case "status":
		return string(a.status), true
	case "topic":
		return pa.topicCode, true
	case "part":
		return a.partition, true
	case "off":
		return a.offset, true
	case "lease":
		return a.leaseMicros, true
	case "ttl":
		return a.ttlMicros, true
	case "scode":
		return pa.scopeCode, true
	case "kid":
		return kidArg(pa.sid.kid), true
	case "kind":
		return string(pa.sid.kind), true
	case "idtext":
		return pa.sid.text, true
	case "tname":
		return a.topic, true
	}
	return nil, false
}
