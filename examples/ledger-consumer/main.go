// Command ledger-consumer is the reference workload of exactly: a Kafka
// ledger worker whose commands move money exactly once. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ledger.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
