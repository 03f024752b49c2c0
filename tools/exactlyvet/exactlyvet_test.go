package exactlyvet_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/exactly-go/exactly/tools/exactlyvet"
)

// TestAnalyzer runs the analyzer on testdata/src/handlers, whose "want"
// comments are the diagnostics it must report, and no others.
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), exactlyvet.Analyzer, "handlers")
}
