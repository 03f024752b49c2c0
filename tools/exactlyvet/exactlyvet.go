// Package exactlyvet is a go vet analyzer for what exactly cannot see at
// run time in a handler that it hands a transaction to:
//
//   - a write through a pool, a connection or a *sql.DB (Exec, CopyFrom,
//     SendBatch, Begin, and a Query whose SQL inserts, updates or
//     deletes) instead of the handler's transaction: the write commits on
//     its own, so a retried or redelivered message applies it again;
//   - Commit or Rollback on the handler's transaction: the middleware owns
//     it (it commits the key with the handler's writes);
//   - msg.Ack() or msg.Nack() in a handler: the router acks, after the
//     commit;
//   - a batch handler that ignores some of its messages (reads none of
//     them, or only msgs[0]): their keys are stored as applied, and their
//     commands are lost.
//
// A handler is a function (declared or literal) with a parameter of type
// pgx.Tx and one of type *message.Message or []*message.Message (the
// shapes of consumer.TxHandlerFunc, consumer.BatchHandlerFunc and
// worker.Config's handlers), or one that takes its transaction from
// httpkey.Tx, consumer.Tx or consumer.TxFromContext. The checks look at the
// handler's own body (its function literals included), not into the
// functions it calls.
//
// Run it with go vet:
//
//	go build -o /tmp/exactlyvet github.com/exactly-go/exactly/tools/exactlyvet/cmd/exactlyvet
//	go vet -vettool=/tmp/exactlyvet ./...
//
// A line that must stay as it is takes a comment "//exactlyvet:ignore"
// with the reason, on the line or the line above.
package exactlyvet

import (
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"regexp"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
	"golang.org/x/tools/go/types/typeutil"
)

// Analyzer reports the handler habits listed in the package doc.
var Analyzer = &analysis.Analyzer{
	Name:     "exactlyvet",
	Doc:      "report what an exactly handler must not do with its transaction, its messages and the pool",
	URL:      "https://pkg.go.dev/github.com/exactly-go/exactly/tools/exactlyvet",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      run,
}

const (
	pgxPath     = "github.com/jackc/pgx/v5"
	poolPath    = "github.com/jackc/pgx/v5/pgxpool"
	msgPath     = "github.com/ThreeDotsLabs/watermill/message"
	httpkeyPath = "github.com/exactly-go/exactly/httpkey"
	consumerPkg = "github.com/exactly-go/exactly/consumer"
)

// outside are the types whose writes do not run in the handler's
// transaction.
var outside = []struct{ pkg, name, show string }{
	{poolPath, "Pool", "*pgxpool.Pool"},
	{poolPath, "Conn", "*pgxpool.Conn"},
	{pgxPath, "Conn", "*pgx.Conn"},
	{"database/sql", "DB", "*sql.DB"},
	{"database/sql", "Conn", "*sql.Conn"},
}

// writes are the methods that write (or open a transaction of their own)
// whatever their arguments; execs write unless their SQL is a constant
// that does not; queries write when their SQL is a constant that does.
var (
	writes = map[string]bool{"CopyFrom": true, "SendBatch": true,
		"Begin": true, "BeginTx": true, "BeginFunc": true, "BeginTxFunc": true}
	execs    = map[string]bool{"Exec": true, "ExecContext": true}
	queries  = map[string]bool{"Query": true, "QueryRow": true, "QueryContext": true, "QueryRowContext": true}
	writeSQL = regexp.MustCompile(`(?i)\b(insert|update|delete|merge|truncate)\b`)
)

// handler is a function given a transaction.
type handler struct {
	body *ast.BlockStmt
	// txs are the variables that hold the handler's transaction.
	txs map[types.Object]bool
	// msgs is the batch's []*message.Message parameter, if any; msgsField
	// its declaration.
	msgs      types.Object
	msgsField *ast.Field
	batch     bool
}

func run(pass *analysis.Pass) (any, error) {
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	ignored := ignoredLines(pass)
	reported := map[token.Pos]bool{}
	report := func(pos token.Pos, format string, args ...any) {
		p := pass.Fset.Position(pos)
		if reported[pos] || ignored[p.Filename][p.Line] {
			return
		}
		reported[pos] = true
		pass.Reportf(pos, format, args...)
	}
	ins.Preorder([]ast.Node{(*ast.FuncDecl)(nil), (*ast.FuncLit)(nil)}, func(n ast.Node) {
		var typ *ast.FuncType
		var body *ast.BlockStmt
		switch f := n.(type) {
		case *ast.FuncDecl:
			typ, body = f.Type, f.Body
		case *ast.FuncLit:
			typ, body = f.Type, f.Body
		}
		if body == nil {
			return
		}
		h, ok := handlerOf(pass, typ, body)
		if !ok {
			return
		}
		check(pass, h, report)
	})
	return nil, nil
}

// handlerOf says whether the function typ/body is a handler given a
// transaction, and what holds it.
func handlerOf(pass *analysis.Pass, typ *ast.FuncType, body *ast.BlockStmt) (*handler, bool) {
	h := &handler{body: body, txs: map[types.Object]bool{}}
	var hasMsg bool
	for _, f := range typ.Params.List {
		t := pass.TypesInfo.TypeOf(f.Type)
		switch {
		case isNamed(t, pgxPath, "Tx"):
			for _, name := range f.Names {
				if obj := pass.TypesInfo.Defs[name]; obj != nil {
					h.txs[obj] = true
				}
			}
			if len(f.Names) == 0 {
				// An unnamed transaction: still a handler's shape.
				h.txs[nil] = true
			}
		case isPtrTo(t, msgPath, "Message"):
			hasMsg = true
		case isSliceOfMessages(t):
			hasMsg, h.batch, h.msgsField = true, true, f
			if len(f.Names) == 1 {
				h.msgs = pass.TypesInfo.Defs[f.Names[0]]
			}
		}
	}
	sigHandler := len(h.txs) > 0 && hasMsg
	delete(h.txs, nil)
	if !sigHandler || !returnsOutputs(pass, typ) {
		// Only a batch handler's shape (it returns one slice of outputs
		// per message) promises to apply each of msgs.
		h.batch, h.msgsField, h.msgs = false, nil, nil
	}
	// Transactions taken from the context, in this function's own body.
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if _, ok := n.(*ast.FuncLit); ok {
			return false
		}
		as, ok := n.(*ast.AssignStmt)
		if ok && len(as.Rhs) == 1 {
			if call, ok := as.Rhs[0].(*ast.CallExpr); ok && txSource(pass, call) {
				found = true
				if id, ok := as.Lhs[0].(*ast.Ident); ok {
					if obj := pass.TypesInfo.ObjectOf(id); obj != nil {
						h.txs[obj] = true
					}
				}
			}
		}
		if call, ok := n.(*ast.CallExpr); ok && txSource(pass, call) {
			found = true
		}
		return true
	})
	return h, sigHandler || found
}

// returnsOutputs says whether typ returns ([][]*message.Message, error),
// a batch handler's results.
func returnsOutputs(pass *analysis.Pass, typ *ast.FuncType) bool {
	if typ.Results == nil || len(typ.Results.List) == 0 {
		return false
	}
	s, ok := types.Unalias(pass.TypesInfo.TypeOf(typ.Results.List[0].Type)).(*types.Slice)
	return ok && isSliceOfMessages(s.Elem())
}

// txSource says whether call returns the handler's transaction from its
// context: httpkey.Tx, consumer.Tx or consumer.TxFromContext.
func txSource(pass *analysis.Pass, call *ast.CallExpr) bool {
	fn, ok := typeutil.Callee(pass.TypesInfo, call).(*types.Func)
	if !ok || fn.Pkg() == nil || fn.Signature().Recv() != nil {
		return false
	}
	switch fn.Pkg().Path() {
	case httpkeyPath:
		return fn.Name() == "Tx"
	case consumerPkg:
		return fn.Name() == "Tx" || fn.Name() == "TxFromContext"
	}
	return false
}

func check(pass *analysis.Pass, h *handler, report func(token.Pos, string, ...any)) {
	covered := false
	var uses []*ast.Ident
	var walk func(n ast.Node) bool
	parents := map[ast.Node]ast.Node{}
	walk = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			checkCall(pass, h, n, report)
		case *ast.Ident:
			if h.msgs != nil && pass.TypesInfo.Uses[n] == h.msgs {
				uses = append(uses, n)
			}
		}
		return true
	}
	var stack []ast.Node
	ast.Inspect(h.body, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		if len(stack) > 0 {
			parents[n] = stack[len(stack)-1]
		}
		stack = append(stack, n)
		return walk(n)
	})
	if !h.batch {
		return
	}
	for _, id := range uses {
		if coversAll(pass, id, parents) {
			covered = true
			break
		}
	}
	if covered {
		return
	}
	pos := h.msgsField.Pos()
	if len(uses) > 0 {
		pos = uses[0].Pos()
	}
	report(pos, "batch handler reads none of its messages, or only some by constant index: every message of msgs is "+
		"stored as applied when the handler returns nil, so the others are lost; apply each message of msgs "+
		"(range over it), or return a consumer.MessageError for the ones it cannot apply")
}

// coversAll says whether the use id of the batch's messages may reach
// every message: ranged over, indexed by a variable, sliced, passed on or
// stored; not len(msgs), cap(msgs) or msgs[0].
func coversAll(pass *analysis.Pass, id *ast.Ident, parents map[ast.Node]ast.Node) bool {
	switch p := parents[id].(type) {
	case *ast.IndexExpr:
		if p.X != id {
			return true
		}
		tv, ok := pass.TypesInfo.Types[p.Index]
		return !ok || tv.Value == nil
	case *ast.CallExpr:
		if b, ok := pass.TypesInfo.Uses[identOf(p.Fun)].(*types.Builtin); ok {
			return b.Name() != "len" && b.Name() != "cap"
		}
		return true
	}
	return true
}

func identOf(e ast.Expr) *ast.Ident {
	id, _ := ast.Unparen(e).(*ast.Ident)
	return id
}

func checkCall(pass *analysis.Pass, h *handler, call *ast.CallExpr, report func(token.Pos, string, ...any)) {
	sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if !ok {
		return
	}
	selection := pass.TypesInfo.Selections[sel]
	if selection == nil || selection.Kind() != types.MethodVal {
		return
	}
	name := sel.Sel.Name
	recv := selection.Recv()
	for _, o := range outside {
		if !isNamed(recv, o.pkg, o.name) {
			continue
		}
		sql, isConst := constSQL(pass, call)
		if writes[name] || execs[name] && (!isConst || writeSQL.MatchString(sql)) ||
			queries[name] && isConst && writeSQL.MatchString(sql) {
			report(call.Pos(), "%s.%s on a %s in a handler given a transaction: it commits on its own, "+
				"so a message delivered again (or a request retried) applies it twice; run it on the handler's transaction",
				render(sel.X), name, o.show)
		}
		return
	}
	switch {
	case (name == "Commit" || name == "Rollback") && isNamed(recv, pgxPath, "Tx") && ownTx(pass, h, sel.X):
		report(call.Pos(), "%s.%s in a handler: the handler's transaction belongs to exactly, which commits it "+
			"with the message's key (and rolls it back when the handler returns an error); return nil or an error instead",
			render(sel.X), name)
	case (name == "Ack" || name == "Nack") && isPtrTo(recv, msgPath, "Message"):
		report(call.Pos(), "%s.%s in a handler: exactly acks a message after its transaction commits and nacks it "+
			"on an error; return nil or an error instead", render(sel.X), name)
	}
}

// ownTx says whether x is the handler's transaction: a variable that holds
// it, or a call that returns it from the context.
func ownTx(pass *analysis.Pass, h *handler, x ast.Expr) bool {
	switch x := ast.Unparen(x).(type) {
	case *ast.Ident:
		return h.txs[pass.TypesInfo.Uses[x]]
	case *ast.CallExpr:
		return txSource(pass, x)
	}
	return false
}

// constSQL returns a call's SQL when it is a constant (its first string
// argument).
func constSQL(pass *analysis.Pass, call *ast.CallExpr) (string, bool) {
	for _, arg := range call.Args {
		tv, ok := pass.TypesInfo.Types[arg]
		if ok && types.Identical(tv.Type.Underlying(), types.Typ[types.String]) {
			if tv.Value != nil && tv.Value.Kind() == constant.String {
				return constant.StringVal(tv.Value), true
			}
			return "", false
		}
	}
	return "", false
}

func render(e ast.Expr) string {
	var b strings.Builder
	var r func(ast.Expr)
	r = func(e ast.Expr) {
		switch e := e.(type) {
		case *ast.Ident:
			b.WriteString(e.Name)
		case *ast.SelectorExpr:
			r(e.X)
			b.WriteString("." + e.Sel.Name)
		case *ast.CallExpr:
			r(e.Fun)
			b.WriteString("(…)")
		case *ast.ParenExpr:
			r(e.X)
		case *ast.StarExpr:
			b.WriteString("*")
			r(e.X)
		default:
			b.WriteString("…")
		}
	}
	r(e)
	return b.String()
}

func named(t types.Type) *types.Named {
	if t == nil {
		return nil
	}
	t = types.Unalias(t)
	if p, ok := t.(*types.Pointer); ok {
		t = types.Unalias(p.Elem())
	}
	n, _ := t.(*types.Named)
	return n
}

// isNamed says whether t (or what it points to) is pkg.name.
func isNamed(t types.Type, pkg, name string) bool {
	n := named(t)
	return n != nil && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == pkg && n.Obj().Name() == name
}

func isPtrTo(t types.Type, pkg, name string) bool {
	if t == nil {
		return false
	}
	_, ok := types.Unalias(t).(*types.Pointer)
	return ok && isNamed(t, pkg, name)
}

func isSliceOfMessages(t types.Type) bool {
	if t == nil {
		return false
	}
	s, ok := types.Unalias(t).Underlying().(*types.Slice)
	return ok && isPtrTo(s.Elem(), msgPath, "Message")
}

// ignoredLines returns, per file, the lines that an //exactlyvet:ignore
// comment covers: its own, and the next when it stands on a line alone.
func ignoredLines(pass *analysis.Pass) map[string]map[int]bool {
	out := map[string]map[int]bool{}
	for _, f := range pass.Files {
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if !strings.HasPrefix(c.Text, "//exactlyvet:ignore") {
					continue
				}
				p := pass.Fset.Position(c.Slash)
				if out[p.Filename] == nil {
					out[p.Filename] = map[int]bool{}
				}
				out[p.Filename][p.Line] = true
				if src, err := pass.ReadFile(p.Filename); err == nil && p.Offset >= p.Column-1 &&
					strings.TrimSpace(string(src[p.Offset-(p.Column-1):p.Offset])) == "" {
					out[p.Filename][p.Line+1] = true
				}
			}
		}
	}
	return out
}
