package replaycli_test

import (
	"bytes"
	"context"
	"log/slog"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// run runs the CLI and returns its exit code, stdout and stderr.
func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := replaycli.Main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}
