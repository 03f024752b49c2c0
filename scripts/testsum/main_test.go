package main

import (
	"os"
	"strings"
	"testing"
)

// testdata/run.json is `go test -json` of a package with passing, failing
// and skipped tests (a subtest, a multi-line reason, a bare SkipNow).
func TestSummarizeRecorded(t *testing.T) {
	f, err := os.Open("testdata/run.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out strings.Builder
	if summarize(f, &out) {
		t.Fatal("a run with a failed test passed")
	}
	got := out.String()
	lines := strings.Split(strings.TrimRight(got, "\n"), "\n")
	if last := lines[len(lines)-1]; last != "tests: 3 passed, 1 failed, 4 skipped" {
		t.Fatalf("last line %q\n%s", last, got)
	}
	for _, want := range []string{
		"  2 × no Postgres: set TEST_DATABASE_URL\n      example.com/fix/p.TestSkipAlsoNoPostgres, example.com/fix/p.TestSkipNoPostgres\n",
		"  1 × needs a real broker's admin API second line\n      example.com/fix/p.TestSub/b\n",
		"  1 × (no reason given)\n      example.com/fix/p.TestSkipNow\n",
		"balance 3, want 4\n--- FAIL: TestFail",
		"FAIL\texample.com/fix/p",
		"\nfailed tests (1):\n  example.com/fix/p.TestFail\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "fine") || strings.Contains(got, "looking") {
		t.Errorf("output shows a passing or skipped test's log:\n%s", got)
	}
}

func TestSummarizePassAndBuildFailure(t *testing.T) {
	pass := `{"Action":"start","Package":"x/a"}
{"Action":"run","Package":"x/a","Test":"TestA"}
{"Action":"output","Package":"x/a","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"pass","Package":"x/a","Test":"TestA"}
{"Action":"output","Package":"x/a","Output":"ok  \tx/a\t0.01s\n"}
{"Action":"pass","Package":"x/a"}
`
	var out strings.Builder
	if !summarize(strings.NewReader(pass), &out) {
		t.Fatalf("a passing run failed:\n%s", out.String())
	}
	if got := out.String(); got != "ok  \tx/a\t0.01s\ntests: 1 passed, 0 failed, 0 skipped\n" {
		t.Fatalf("got %q", got)
	}
	broken := "go: downloading example.com/m v1.0.0\n" + `{"ImportPath":"x/b","Action":"build-output","Output":"x/b/b.go:3:1: syntax error\n"}
{"ImportPath":"x/b","Action":"build-fail"}
{"Action":"output","Package":"x/b","Output":"FAIL\tx/b [build failed]\n"}
{"Action":"fail","Package":"x/b"}
`
	out.Reset()
	if summarize(strings.NewReader(broken), &out) {
		t.Fatal("a build failure passed")
	}
	for _, want := range []string{"go: downloading example.com/m v1.0.0\n", "syntax error", "FAIL\tx/b [build failed]", "tests: 0 passed, 0 failed, 0 skipped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// What a passing package prints outside its tests stays hidden, as with go
// test; a failing package's is shown.
func TestSummarizePackageOutput(t *testing.T) {
	in := `{"Action":"output","Package":"x/a","Output":"noise from a goroutine\n"}
{"Action":"output","Package":"x/a","Output":"ok  \tx/a\t0.01s\n"}
{"Action":"pass","Package":"x/a"}
{"Action":"output","Package":"x/b","Output":"panic: boom\n"}
{"Action":"output","Package":"x/b","Output":"FAIL\tx/b\t0.01s\n"}
{"Action":"fail","Package":"x/b"}
`
	var out strings.Builder
	if summarize(strings.NewReader(in), &out) {
		t.Fatal("a failed package passed")
	}
	want := "ok  \tx/a\t0.01s\npanic: boom\nFAIL\tx/b\t0.01s\ntests: 0 passed, 0 failed, 0 skipped\n"
	if out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
}

// A package run twice (make test runs kafkapubsub again without -race)
// prints each run's summary line once.
func TestSummarizePackageRunTwice(t *testing.T) {
	in := `{"Action":"run","Package":"x/a","Test":"TestA"}
{"Action":"pass","Package":"x/a","Test":"TestA"}
{"Action":"output","Package":"x/a","Output":"ok  \tx/a\t0.01s\n"}
{"Action":"pass","Package":"x/a"}
{"Action":"run","Package":"x/a","Test":"TestB"}
{"Action":"pass","Package":"x/a","Test":"TestB"}
{"Action":"output","Package":"x/a","Output":"ok  \tx/a\t0.02s\n"}
{"Action":"pass","Package":"x/a"}
`
	var out strings.Builder
	if !summarize(strings.NewReader(in), &out) {
		t.Fatalf("a passing run failed:\n%s", out.String())
	}
	if want := "ok  \tx/a\t0.01s\nok  \tx/a\t0.02s\ntests: 2 passed, 0 failed, 0 skipped\n"; out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}

func TestReasonShortened(t *testing.T) {
	long := "    x_test.go:9: could not start a broker: " + strings.Repeat("log line ", 100) + "\n"
	r := reason([]string{"=== RUN   TestX\n", long, "--- SKIP: TestX (0.00s)\n"})
	if !strings.HasPrefix(r, "could not start a broker: log line") || !strings.HasSuffix(r, " …") || len(r) > maxReason+len(" …") {
		t.Fatalf("reason %q", r)
	}
}
