package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The partitioned layout's statements name their arguments (@scope, @kid,
// ...). pgx.NamedArgs would parse a statement at each execution to number
// them, which cost a request a tenth of the middleware's own CPU in
// BenchmarkMiddleware: each statement is numbered once instead, when its
// queries are made (positionalStmts), and its arguments are listed in that
// order at each execution (partNamed).

// argNames are the names the partitioned layout's statements use.
var argNames = []string{"scope", "id", "fp", "status", "topic", "part", "off", "lease", "ttl",
	"scode", "kid", "kind", "idtext", "tname", "attempts", "result"}

// positional is a statement of named arguments with its arguments
// numbered as pgx.NamedArgs numbers them, and their names in that order.
type positional struct {
	sql   string
	names []string
}

// positionalStmts returns the positional form of each statement of stmts
// that names arguments, by its named text.
func positionalStmts(stmts ...string) map[string]positional {
	all := make(pgx.NamedArgs, len(argNames))
	for _, n := range argNames {
		all[n] = n
	}
	m := make(map[string]positional, len(stmts))
	for _, stmt := range stmts {
		if stmt == "" {
			continue
		}
		sql, args, err := all.RewriteQuery(context.Background(), nil, stmt, nil)
		if err != nil {
			panic(fmt.Sprintf("pgstore: numbering the arguments of %q: %v", stmt, err))
		}
		p := positional{sql: sql, names: make([]string, len(args))}
		for i, a := range args {
			name, ok := a.(string)
			if !ok {
				panic(fmt.Sprintf("pgstore: argument $%d of %q is not one of argNames", i+1, stmt))
			}
			p.names[i] = name
		}
		m[stmt] = p
	}
	return m
}

// partNamed is the arguments of one statement on a key (a claim's, or an
// update's with more), as a pgx.QueryRewriter: it numbers them as the
// statement's positional form (queries.positional) does, and falls back to
// pgx.NamedArgs for a statement that has none.
type partNamed struct {
	a    *claimArgs
	more pgx.NamedArgs
}

// RewriteQuery implements pgx.QueryRewriter.
func (n *partNamed) RewriteQuery(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	var p positional
	ok := false
	if n.a.q != nil {
		p, ok = n.a.q.positional[sql]
	}
	if !ok {
		all := make(pgx.NamedArgs, len(argNames))
		for _, name := range argNames {
			if v, ok := n.value(name); ok {
				all[name] = v
			}
		}
		return all.RewriteQuery(ctx, conn, sql, args)
	}
	out := make([]any, len(p.names))
	for i, name := range p.names {
		out[i], _ = n.value(name) // nil when missing, as with pgx.NamedArgs
	}
	return p.sql, out, nil
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
