// Command pgserver runs a throwaway PostgreSQL server of a given release
// until it is told to stop, for test runs against several PostgreSQL
// versions (scripts/matrix.sh).
//
//	go run ./tools/pgserver -version 13.23.0 -port 57432
//
// -version is a release of the io.zonky.test.postgres binaries on Maven
// Central (fetched once and cached, see package embedpg); -machine runs the
// machine's own PostgreSQL instead. Once the server accepts connections, the
// command prints its URL on a line of stdout, and on stderr the version the
// server itself reports (SHOW server_version). It stops the server and
// removes its data on SIGINT or SIGTERM; if the command is killed, the
// kernel stops the server. The data directory is made under TMPDIR.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/embedpg"
)

func main() {
	version := flag.String("version", embedpg.DefaultVersion, "release of the fetched binaries (io.zonky.test.postgres on Maven Central)")
	machine := flag.Bool("machine", false, "run the machine's own PostgreSQL instead of fetched binaries")
	port := flag.Int("port", 0, "port on 127.0.0.1 (0: a free one)")
	verbose := flag.Bool("v", false, "log what is fetched and started")
	flag.Parse()
	if err := run(*version, *machine, *port, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "pgserver:", err)
		os.Exit(1)
	}
}

func run(version string, machine bool, port int, verbose bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.DiscardHandler)
	if verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	cfg := &embedpg.Config{Fetch: !machine, Version: version, Port: port, StartTimeout: 5 * time.Minute, Logger: logger}
	if machine {
		cfg.Version = ""
	}
	srv, err := embedpg.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer srv.Stop()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		return err
	}
	var reported string
	err = conn.QueryRow(ctx, "SHOW server_version").Scan(&reported)
	_ = conn.Close(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "pgserver: PostgreSQL %s up (binaries %s, pid %d, data %s)\n", reported, srv.BinDir(), srv.Pid(), srv.Dir())
	fmt.Println(srv.URL())
	<-ctx.Done()
	return srv.Stop()
}
