package eprom_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/plugin/eprom"
	"github.com/exactly-go/exactly/worker"
)

// dashboardPath is the Grafana dashboard for these metrics, in the
// repository's docs.
const dashboardPath = "../../docs/grafana/exactly.json"

// targetLabels are added by Prometheus when it scrapes, not by Metrics.
var targetLabels = []string{"job", "instance"}

// series is one name a scrape of Metrics exposes (a histogram family
// exposes three: _bucket, _sum and _count), with the labels it carries and
// the values each label took.
type series struct {
	family string
	labels map[string]map[string]bool
}

// TestDashboard checks docs/grafana/exactly.json against what Metrics
// exports, after every hook and every stats source has been exercised once:
// each PromQL expression of a panel or a variable selects only series that
// exist, with labels they carry and label values they take, and every
// exported metric appears on the dashboard.
func TestDashboard(t *testing.T) {
	dash, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedSeries(t)
	if problems := dashboardProblems(dash, exported); len(problems) > 0 {
		t.Fatalf("%s does not match the metrics eprom exports:\n%s", dashboardPath, strings.Join(problems, "\n"))
	}
}

// The check fails on a dashboard that names a metric, a label or a label
// value that Metrics does not export, or that leaves a metric out.
func TestDashboardProblems(t *testing.T) {
	dash, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedSeries(t)
	for _, c := range []struct{ old, new, want string }{
		{`exactly_outbox_dead_total{`, `exactly_outbox_deaths_total{`, `exactly_outbox_deaths_total: not a metric eprom exports`},
		{`exactly_messages_total{job=~\"$job\", scope=~\"$scope\", topic=~\"$topic\", outcome=\"in_flight\"}`,
			`exactly_messages_total{job=~\"$job\", scope=~\"$scope\", topic=~\"$topic\", outcome=\"inflight\"}`,
			`outcome="inflight": exactly_messages_total has no such value`},
		{`sum by (source)`, `sum by (sources)`, `by/without/on/ignoring (sources): no series of the expression has that label`},
		{`exactly_keys_table_bytes{`, `exactly_keys{`, `exactly_keys_table_bytes: exported, but on no panel`},
		{`histogram_quantile(0.99, sum by (le) (rate(exactly_outbox_publish_lag_seconds_bucket`,
			`histogram_quantile(0.99, sum by (le) (rate(exactly_outbox_publish_lag_seconds`, `exactly_outbox_publish_lag_seconds: not a metric eprom exports`},
		{`"uid": "${datasource}"`, `"uid": "prometheus"`, `datasource is not the ${datasource} variable`},
	} {
		if !strings.Contains(string(dash), c.old) {
			t.Fatalf("the dashboard has no %s: update this test", c.old)
		}
		broken := strings.Replace(string(dash), c.old, c.new, 1)
		problems := dashboardProblems([]byte(broken), exported)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.want) }) {
			t.Errorf("with %s for %s: problems %q, want one saying %q", c.new, c.old, problems, c.want)
		}
	}
}

// outcomes returns the consumer.Outcome constants that package consumer
// declares, read from its source, so that a new outcome is exercised too.
func outcomes(t *testing.T) []consumer.Outcome {
	t.Helper()
	files, err := filepath.Glob("../../consumer/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []consumer.Outcome
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Outcome" {
					continue
				}
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						out = append(out, consumer.Outcome(s))
					}
				}
			}
		}
	}
	if !slices.Contains(out, consumer.OutcomeApplied) || !slices.Contains(out, consumer.OutcomeUnavailable) {
		t.Fatalf("read outcomes %q from package consumer's source, want every consumer.Outcome constant", out)
	}
	return out
}

// stats are stats sources whose first read fails and later reads succeed,
// so that two scrapes show both the error counter and the gauges.
type stats struct{ calls int }

var errFirstScrape = errors.New("first scrape fails")

func (s *stats) Stats(context.Context) (dedupe.Stats, error) {
	if s.calls++; s.calls == 1 {
		return dedupe.Stats{}, errFirstScrape
	}
	return dedupe.Stats{Processing: 1, Completed: 2, Expired: 3, TableBytes: 4096}, nil
}

type outboxStats struct{ calls int }

func (s *outboxStats) Stats(context.Context) (outbox.Stats, error) {
	if s.calls++; s.calls == 1 {
		return outbox.Stats{}, errFirstScrape
	}
	return outbox.Stats{Pending: 1, Dead: 1, Lag: time.Second}, nil
}

// exportedSeries exercises every hook (each outcome, a batch), scrapes
// twice (the stats sources fail once) and returns the series the scrapes
// held. It fails if a metric that Metrics describes never showed up.
func exportedSeries(t *testing.T) map[string]series {
	t.Helper()
	m := eprom.New(nil)
	m.WatchKeys(&stats{})
	m.WatchOutbox(&outboxStats{})
	offsetCalls := 0
	m.WatchOffsets(func(context.Context) ([]worker.PartitionOffsets, error) {
		if offsetCalls++; offsetCalls == 1 {
			return nil, errFirstScrape
		}
		return []worker.PartitionOffsets{{Topic: "orders.commands", Partition: 0, Committed: 5, Position: 7, End: 9}}, nil
	})
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, o := range outcomes(t) {
		ev := consumer.Event{Scope: "orders", Topic: "orders.commands", Outcome: o, Duration: time.Millisecond, Offset: -1}
		if o == consumer.OutcomeKeyReused {
			ev.Err = fmt.Errorf("claim: %w", dedupe.ErrKeyReused)
		}
		m.OnMessage(ctx, ev)
	}
	m.OnBatch(ctx, outbox.BatchEvent{Lanes: []int{0}, Published: 2, Failed: 1, Dead: 1, Lag: time.Second})

	out := map[string]series{}
	add := func(name, family string, labels map[string]string) {
		s, ok := out[name]
		if !ok {
			s = series{family: family, labels: map[string]map[string]bool{}}
			out[name] = s
		}
		for k, v := range labels {
			if s.labels[k] == nil {
				s.labels[k] = map[string]bool{}
			}
			s.labels[k][v] = true
		}
	}
	for range 2 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			name := mf.GetName()
			for _, mt := range mf.GetMetric() {
				labels := map[string]string{}
				for _, lp := range mt.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				switch mf.GetType() {
				case dto.MetricType_HISTOGRAM:
					add(name+"_sum", name, labels)
					add(name+"_count", name, labels)
					for _, b := range mt.GetHistogram().GetBucket() {
						add(name+"_bucket", name, mergeLabels(labels, "le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)))
					}
					add(name+"_bucket", name, mergeLabels(labels, "le", "+Inf"))
				case dto.MetricType_SUMMARY:
					add(name+"_sum", name, labels)
					add(name+"_count", name, labels)
					for _, q := range mt.GetSummary().GetQuantile() {
						add(name, name, mergeLabels(labels, "quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)))
					}
				default:
					add(name, name, labels)
				}
			}
		}
	}

	descs := make(chan *prometheus.Desc)
	go func() { m.Describe(descs); close(descs) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		name := fqName.FindStringSubmatch(d.String())
		if name == nil {
			t.Fatalf("no fqName in %s", d)
		}
		if !slices.ContainsFunc(slices.Collect(maps.Values(out)), func(s series) bool { return s.family == name[1] }) {
			t.Errorf("Metrics describes %s, but no scrape held it: exercise it in exportedSeries", name[1])
		}
	}
	return out
}

func mergeLabels(labels map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for lk, lv := range labels {
		out[lk] = lv
	}
	return out
}

// dashboardProblems returns what is wrong with a dashboard's JSON model
// against the exported series: PromQL that does not parse, metric names,
// labels and label values that are not exported, panels whose datasource
// is not the ${datasource} variable, and exported metrics on no panel.
func dashboardProblems(dash []byte, exported map[string]series) []string {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string          `json:"name"`
				Type       string          `json:"type"`
				Query      json.RawMessage `json:"query"`
				Datasource *datasource     `json:"datasource"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dash, &d); err != nil {
		return []string{fmt.Sprintf("not a dashboard JSON model: %v", err)}
	}
	var problems []string
	used := map[string]bool{}
	check := func(where, expr string) {
		refs, err := promqlRefs(expr)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %q: %v", where, expr, err))
			return
		}
		for _, p := range refsProblems(refs, exported) {
			problems = append(problems, fmt.Sprintf("%s: %q: %s", where, expr, p))
		}
		for _, s := range refs.selectors {
			if e, ok := exported[s.name]; ok {
				used[e.family] = true
			}
		}
	}

	hasDatasourceVar := false
	for _, v := range d.Templating.List {
		where := "variable " + v.Name
		switch v.Type {
		case "datasource":
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil || q != "prometheus" {
				problems = append(problems, fmt.Sprintf("%s: a datasource variable whose query is %s, want \"prometheus\"", where, v.Query))
			}
			if v.Name == "datasource" {
				hasDatasourceVar = true
			}
		case "query":
			if !v.Datasource.isVariable() {
				problems = append(problems, where+": datasource is not the ${datasource} variable")
			}
			var q struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &q); err != nil {
				if err := json.Unmarshal(v.Query, &q.Query); err != nil {
					problems = append(problems, fmt.Sprintf("%s: query %s is neither a string nor an object", where, v.Query))
					continue
				}
			}
			expr, label, err := labelValues(q.Query)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
				continue
			}
			check(where, expr)
			if refs, err := promqlRefs(expr); err == nil && !refsCarry(refs, exported, label) {
				problems = append(problems, fmt.Sprintf("%s: label_values(…, %s): %s has no such label", where, label, expr))
			}
		}
	}
	if !hasDatasourceVar {
		problems = append(problems, `no datasource variable named "datasource" (type "datasource", query "prometheus")`)
	}

	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			where := fmt.Sprintf("panel %q", p.Title)
			if !p.Datasource.isVariable() {
				problems = append(problems, where+": datasource is not the ${datasource} variable")
			}
			if len(p.Targets) == 0 {
				problems = append(problems, where+": no queries")
			}
			for _, tg := range p.Targets {
				if !tg.Datasource.isVariable() {
					problems = append(problems, fmt.Sprintf("%s, query %s: datasource is not the ${datasource} variable", where, tg.RefID))
				}
				check(fmt.Sprintf("%s, query %s", where, tg.RefID), tg.Expr)
			}
		}
	}
	walk(d.Panels)

	var families []string
	for _, s := range exported {
		if !slices.Contains(families, s.family) {
			families = append(families, s.family)
		}
	}
	slices.Sort(families)
	for _, f := range families {
		if !used[f] {
			problems = append(problems, fmt.Sprintf("%s: exported, but on no panel", f))
		}
	}
	return problems
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func (d *datasource) isVariable() bool {
	return d != nil && d.Type == "prometheus" && d.UID == "${datasource}"
}

type panel struct {
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	Targets    []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// labelValues splits a Grafana variable query label_values(expr, label).
func labelValues(q string) (expr, label string, err error) {
	m := regexp.MustCompile(`^\s*label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`).FindStringSubmatch(q)
	if m == nil {
		return "", "", fmt.Errorf("query %q: want label_values(<metric selector>, <label>)", q)
	}
	return m[1], m[2], nil
}

// refsProblems checks an expression's selectors and groupings against the
// exported series.
func refsProblems(refs exprRefs, exported map[string]series) []string {
	var problems []string
	for _, s := range refs.selectors {
		e, ok := exported[s.name]
		if !ok {
			problems = append(problems, s.name+": not a metric eprom exports")
			continue
		}
		for _, m := range s.matchers {
			if slices.Contains(targetLabels, m.label) {
				continue
			}
			values, ok := e.labels[m.label]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: %s has no label %s", m, s.name, m.label))
				continue
			}
			for _, v := range m.literalValues() {
				if !values[v] {
					problems = append(problems, fmt.Sprintf("%s: %s has no such value (it takes %v)", m, s.name, slices.Sorted(maps.Keys(values))))
				}
			}
		}
	}
	for _, l := range refs.grouping {
		if !slices.Contains(targetLabels, l) && !refsCarry(refs, exported, l) {
			problems = append(problems, fmt.Sprintf("by/without/on/ignoring (%s): no series of the expression has that label", l))
		}
	}
	return problems
}

// refsCarry reports whether a series the expression selects has label.
func refsCarry(refs exprRefs, exported map[string]series, label string) bool {
	if slices.Contains(targetLabels, label) {
		return true
	}
	for _, s := range refs.selectors {
		if _, ok := exported[s.name].labels[label]; ok {
			return true
		}
	}
	return false
}

// selector is a PromQL vector selector: a metric name and its matchers.
type selector struct {
	name     string
	matchers []matcher
}

type matcher struct{ label, op, value string }

func (m matcher) String() string { return fmt.Sprintf("%s%s%q", m.label, m.op, m.value) }

// literalValues returns the values an = or =~ matcher accepts when it names
// them outright (a value, or alternatives a|b|c); none for a negative
// matcher, a Grafana variable or another regular expression.
func (m matcher) literalValues() []string {
	if strings.Contains(m.value, "$") {
		return nil
	}
	switch m.op {
	case "=":
		return []string{m.value}
	case "=~":
		alts := strings.Split(m.value, "|")
		for _, a := range alts {
			if a == "" || regexp.QuoteMeta(a) != a {
				return nil
			}
		}
		return alts
	}
	return nil
}

// exprRefs are what a PromQL expression refers to.
type exprRefs struct {
	selectors []selector
	grouping  []string // labels of by, without, on, ignoring, group_left, group_right
}

var (
	aggregations = []string{"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
		"bottomk", "topk", "quantile", "limitk", "limit_ratio"}
	groupings = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}
	keywords  = []string{"and", "or", "unless", "bool", "offset", "inf", "nan"}
)

type tokenKind int

const (
	tokIdent tokenKind = iota
	tokString
	tokNumber
	tokRange
	tokMatchers
	tokPunct
)

type tok struct {
	kind     tokenKind
	text     string
	matchers []matcher
}

// promqlRefs reads the selectors and grouping labels of a PromQL expression
// (Grafana's $variables allowed in strings and ranges). It is a lexer, not a
// parser: it trusts the expression's structure, which Prometheus checks, and
// finds every name in it, which is what the dashboard test needs.
func promqlRefs(expr string) (exprRefs, error) {
	toks, err := lex(expr)
	if err != nil {
		return exprRefs{}, err
	}
	var refs exprRefs
	next := func(i int) *tok {
		if i+1 < len(toks) {
			return &toks[i+1]
		}
		return nil
	}
	isPunct := func(t *tok, s string) bool { return t != nil && t.kind == tokPunct && t.text == s }
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch t.kind {
		case tokMatchers:
			return exprRefs{}, fmt.Errorf("a selector without a metric name: {%v}", t.matchers)
		case tokIdent:
			word := strings.ToLower(t.text)
			n := next(i)
			switch {
			case slices.Contains(groupings, word):
				if !isPunct(n, "(") {
					continue // group_left without labels
				}
				i += 2
				for ; i < len(toks) && !isPunct(&toks[i], ")"); i++ {
					switch {
					case toks[i].kind == tokIdent:
						refs.grouping = append(refs.grouping, toks[i].text)
					case !isPunct(&toks[i], ","):
						return exprRefs{}, fmt.Errorf("%s (…): unexpected %q", word, toks[i].text)
					}
				}
				if i == len(toks) {
					return exprRefs{}, fmt.Errorf("%s (…: no closing parenthesis", word)
				}
			case isPunct(n, "("):
				// a function or an aggregation's call
			case slices.Contains(aggregations, word) && n != nil && n.kind == tokIdent && slices.Contains(groupings, strings.ToLower(n.text)):
				// sum by (…) (…)
			case slices.Contains(keywords, word):
			default:
				s := selector{name: t.text}
				if n != nil && n.kind == tokMatchers {
					s.matchers = n.matchers
					i++
				}
				refs.selectors = append(refs.selectors, s)
			}
		}
	}
	if len(refs.selectors) == 0 {
		return exprRefs{}, errors.New("selects no metric")
	}
	return refs, nil
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdent(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

func lex(s string) ([]tok, error) {
	var toks []tok
	i := 0
	ident := func() string {
		j := i
		for i < len(s) && isIdent(s[i]) {
			i++
		}
		return s[j:i]
	}
	str := func() (string, error) {
		q := s[i]
		j := i
		for i++; i < len(s); i++ {
			switch {
			case s[i] == '\\' && q != '`':
				i++
			case s[i] == q:
				i++
				if q == '`' {
					return s[j+1 : i-1], nil
				}
				v, err := strconv.Unquote(`"` + strings.ReplaceAll(s[j+1:i-1], `"`, `\"`) + `"`)
				if err != nil {
					return "", fmt.Errorf("string %s: %v", s[j:i], err)
				}
				return v, nil
			}
		}
		return "", fmt.Errorf("unterminated string %s", s[j:])
	}
	space := func() {
		for i < len(s) && strings.IndexByte(" \t\r\n", s[i]) >= 0 {
			i++
		}
	}
	for space(); i < len(s); space() {
		c := s[i]
		switch {
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			v, err := str()
			if err != nil {
				return nil, err
			}
			toks = append(toks, tok{kind: tokString, text: v})
		case c == '[':
			j := strings.IndexByte(s[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated range %s", s[i:])
			}
			toks = append(toks, tok{kind: tokRange, text: s[i : i+j+1]})
			i += j + 1
		case c == '{':
			i++
			var ms []matcher
			for {
				space()
				if i < len(s) && s[i] == '}' {
					i++
					break
				}
				if i == len(s) || !isIdentStart(s[i]) {
					return nil, fmt.Errorf("label matchers: want a label name at %q", s[i:])
				}
				m := matcher{label: ident()}
				space()
				for _, op := range []string{"=~", "!~", "!=", "="} {
					if strings.HasPrefix(s[i:], op) {
						m.op = op
						i += len(op)
						break
					}
				}
				if m.op == "" {
					return nil, fmt.Errorf("label matchers: want =, !=, =~ or !~ after %s", m.label)
				}
				space()
				if i == len(s) || strings.IndexByte("\"'`", s[i]) < 0 {
					return nil, fmt.Errorf("label matchers: want a string after %s%s", m.label, m.op)
				}
				v, err := str()
				if err != nil {
					return nil, err
				}
				m.value = v
				if m.label == "__name__" {
					return nil, fmt.Errorf("label matchers: name the metric, not %s", m)
				}
				ms = append(ms, m)
				space()
				if i < len(s) && s[i] == ',' {
					i++
				}
			}
			toks = append(toks, tok{kind: tokMatchers, matchers: ms})
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9':
			j := i
			for i < len(s) && (isIdent(s[i]) || s[i] == '.' ||
				(s[i] == '+' || s[i] == '-') && (s[i-1] == 'e' || s[i-1] == 'E') && !strings.HasPrefix(s[j:], "0x")) {
				i++
			}
			toks = append(toks, tok{kind: tokNumber, text: s[j:i]})
		case isIdentStart(c):
			toks = append(toks, tok{kind: tokIdent, text: ident()})
		case strings.IndexByte("()+-*/%^=!<>@,:", c) >= 0:
			toks = append(toks, tok{kind: tokPunct, text: string(c)})
			i++
		case c == '$':
			return nil, fmt.Errorf("a Grafana variable outside a string or a range: %q", s[i:])
		default:
			return nil, fmt.Errorf("unexpected %q", s[i:])
		}
	}
	return toks, nil
}

// The lexer finds metric names, matchers and grouping labels where PromQL
// puts them, and refuses what it cannot read.
func TestPromQLRefs(t *testing.T) {
	for _, c := range []struct {
		expr      string
		selectors string
		grouping  []string
		err       string
	}{
		{expr: `sum by (le, outcome) (rate(a_bucket{x="1", y=~"$v"}[$__rate_interval]))`,
			selectors: `a_bucket[x="1" y=~"$v"]`, grouping: []string{"le", "outcome"}},
		{expr: `histogram_quantile(0.99, sum(rate(a_bucket[5m])) by (le))`, selectors: `a_bucket[]`, grouping: []string{"le"}},
		{expr: `a / on (job) group_left (scope) b offset 5m`, selectors: `a[] b[]`, grouping: []string{"job", "scope"}},
		{expr: `label_replace(up{a='x'}, "dst", "$1", "src", "(.*)")`, selectors: `up[a="x"]`},
		{expr: "max(x) > bool 0.5 and y unless z{a!~`b|c`} or 1e-3", selectors: `x[] y[] z[a!~"b|c"]`},
		{expr: `sum without (instance) (x) / ignoring (a) group_left y # a comment`, selectors: `x[] y[]`, grouping: []string{"instance", "a"}},
		{expr: `topk(5, rate(x:rate5m{a="b",}[1h:5m]))`, selectors: `x:rate5m[a="b"]`},
		{expr: `{job="a"}`, err: "without a metric name"},
		{expr: `x{__name__="y"}`, err: "name the metric"},
		{expr: `rate(x[5m]) * $factor`, err: "Grafana variable"},
		{expr: `x{job="a"`, err: "want a label name"},
		{expr: `x{job=a}`, err: "want a string"},
		{expr: `x{job~"a"}`, err: "want =, !=, =~ or !~"},
		{expr: `rate(x[5m)`, err: "unterminated range"},
		{expr: `x{a="b}`, err: "unterminated string"},
		{expr: `sum by (le`, err: "no closing parenthesis"},
		{expr: `vector(1)`, err: "selects no metric"},
	} {
		refs, err := promqlRefs(c.expr)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("promqlRefs(%s) = %v, %v; want an error saying %q", c.expr, refs, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("promqlRefs(%s): %v", c.expr, err)
			continue
		}
		var got []string
		for _, s := range refs.selectors {
			var ms []string
			for _, m := range s.matchers {
				ms = append(ms, m.String())
			}
			got = append(got, s.name+"["+strings.Join(ms, " ")+"]")
		}
		if strings.Join(got, " ") != c.selectors || !slices.Equal(refs.grouping, c.grouping) {
			t.Errorf("promqlRefs(%s) = %s, grouping %q; want %s, grouping %q", c.expr, strings.Join(got, " "), refs.grouping, c.selectors, c.grouping)
		}
	}
}
