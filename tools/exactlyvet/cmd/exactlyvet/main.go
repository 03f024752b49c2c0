// Command exactlyvet runs the exactlyvet analyzer: alone on packages
// (exactlyvet ./...) or as go vet's tool (go vet -vettool=$(which exactlyvet) ./...).
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/exactly-go/exactly/tools/exactlyvet"
)

func main() { singlechecker.Main(exactlyvet.Analyzer) }
