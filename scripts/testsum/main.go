// Command testsum reads `go test -json` on standard input and prints what
// go test prints (a line per package, the output of failed tests), then
// every skipped test with the reason it gave, grouped by reason, the failed
// tests, and a last line that counts them:
//
//	tests: 812 passed, 0 failed, 3 skipped
//
// It exits 1 when a test, a package or a build failed. `make test` pipes
// the suite through it, so a skip is never silent.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

func main() {
	if !summarize(os.Stdin, os.Stdout) {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail
	Test       string
	Output     string
}

type skip struct{ test, reason string }

// summarize copies the run's report to w and reports whether it passed.
func summarize(r io.Reader, w io.Writer) bool {
	var (
		passed, failed int
		skips          []skip
		fails          []string
		ok             = true
		outputs        = map[string][]string{} // package + " " + test -> its output
		summaries      = map[string]string{}   // package -> its "ok" or "FAIL" line
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(w, string(line)) // go's own messages, build errors on stderr
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "build-fail":
			ok = false
		case "output":
			if e.Test == "" {
				// Like go test on a list of packages: the summary line
				// always, the rest of a package's output only if it fails.
				if summaryLine.MatchString(e.Output) {
					summaries[e.Package] += e.Output
				} else if s := strings.TrimSpace(e.Output); s != "PASS" && s != "FAIL" && !strings.HasPrefix(s, "=== ") {
					outputs[key] = append(outputs[key], e.Output)
				}
				continue
			}
			outputs[key] = append(outputs[key], e.Output)
		case "pass":
			if e.Test != "" {
				passed++
			}
			delete(outputs, key)
			if e.Test == "" {
				fmt.Fprint(w, summaries[e.Package])
				delete(summaries, e.Package) // a package may run again (make test's second go test)
			}
		case "skip":
			if e.Test != "" {
				skips = append(skips, skip{short(e.Package) + "." + e.Test, reason(outputs[key])})
			} else {
				fmt.Fprint(w, summaries[e.Package]) // no test files
				delete(summaries, e.Package)
			}
			delete(outputs, key)
		case "fail":
			ok = false
			if e.Test != "" {
				failed++
				fails = append(fails, short(e.Package)+"."+e.Test)
			}
			for _, o := range outputs[key] {
				if !strings.HasPrefix(o, "=== ") {
					fmt.Fprint(w, o)
				}
			}
			delete(outputs, key)
			if e.Test == "" {
				fmt.Fprint(w, summaries[e.Package])
				delete(summaries, e.Package) // a package may run again (make test's second go test)
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(w, "testsum: reading go test -json:", err)
		ok = false
	}
	printSkips(w, skips)
	if len(fails) > 0 {
		fmt.Fprintf(w, "\nfailed tests (%d):\n  %s\n", len(fails), strings.Join(fails, "\n  "))
	}
	fmt.Fprintf(w, "tests: %d passed, %d failed, %d skipped\n", passed, failed, len(skips))
	return ok
}

// summaryLine is go test's line for a package: "ok  \tpkg\t1.2s",
// "FAIL\tpkg\t1.2s", "?   \tpkg\t[no test files]".
var summaryLine = regexp.MustCompile(`^(ok  |FAIL|\?   )\t`)

// logLine is a t.Log/t.Skip line as go test prints it: "    file_test.go:12: message".
var logLine = regexp.MustCompile(`^\s+[\w.-]+\.go:\d+: `)

// reason is the message of a skipped test's last log entry (the t.Skip
// call's), without its file:line, on one line.
func reason(output []string) string {
	last := -1
	for i, o := range output {
		if logLine.MatchString(o) {
			last = i
		}
	}
	if last < 0 {
		return "(no reason given)"
	}
	var parts []string
	for i, o := range output[last:] {
		if strings.HasPrefix(strings.TrimSpace(o), "--- SKIP") {
			break
		}
		if i == 0 {
			o = logLine.ReplaceAllString(o, "")
		}
		if s := strings.TrimSpace(o); s != "" {
			parts = append(parts, s)
		}
	}
	r := strings.Join(parts, " ")
	if len(r) > maxReason {
		r = strings.ToValidUTF8(r[:maxReason], "") + " …"
	}
	return r
}

// maxReason keeps a reason that quotes a whole log to a line or two.
const maxReason = 200

func printSkips(w io.Writer, skips []skip) {
	if len(skips) == 0 {
		return
	}
	by := map[string][]string{}
	for _, s := range skips {
		by[s.reason] = append(by[s.reason], s.test)
	}
	reasons := make([]string, 0, len(by))
	for r := range by {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if len(by[reasons[i]]) != len(by[reasons[j]]) {
			return len(by[reasons[i]]) > len(by[reasons[j]])
		}
		return reasons[i] < reasons[j]
	})
	fmt.Fprintf(w, "\nskipped tests (%d), by reason:\n", len(skips))
	for _, r := range reasons {
		tests := by[r]
		sort.Strings(tests)
		shown := tests
		if len(shown) > 4 {
			shown = shown[:4]
		}
		more := ""
		if len(tests) > len(shown) {
			more = fmt.Sprintf(" and %d more", len(tests)-len(shown))
		}
		fmt.Fprintf(w, "  %d × %s\n      %s%s\n", len(tests), r, strings.Join(shown, ", "), more)
	}
}

// short is a package path without the module's prefix.
func short(pkg string) string {
	return strings.TrimPrefix(pkg, "github.com/exactly-go/exactly/")
}
