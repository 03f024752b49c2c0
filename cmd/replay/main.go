// Command replay redelivers Kafka topics and proves that their consumers
// deduplicate. Run "replay --help".
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := replaycli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
