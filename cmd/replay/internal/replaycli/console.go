package replaycli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// ConsoleConfig configures Console.
type ConsoleConfig struct {
	Brokers  []string
	Security kafkapubsub.Security
	// DatabaseURL is the worker's database. Required.
	DatabaseURL string
	// Addr is where the page is served. Defaults to 127.0.0.1:8080.
	Addr string
	// Listening, when set, is called with the address once it listens.
	Listening func(addr string)
	// Console is the page's configuration (Group, Topics,
	// DeadLetterTopic, Schema, Token, TrustedHeader…).
	Console console.Config
}

// Console serves the operator console (package console) standalone, on a
// pool of its own, until ctx ends.
func Console(ctx context.Context, o ConsoleConfig, stderr io.Writer) error {
	if o.DatabaseURL == "" {
		return fmt.Errorf("%w: --database-url (or DATABASE_URL) is required: the worker's database", errUsage)
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:8080"
	}
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return fmt.Errorf("%w at %s: %v", errDatabase, Redact(o.DatabaseURL), redact.Error(err, o.DatabaseURL))
	}
	defer pool.Close()
	cfg := o.Console
	cfg.Brokers, cfg.Security = o.Brokers, o.Security
	c, err := console.New(pool, &cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return fmt.Errorf("%w: listen on %s: %v", errUsage, o.Addr, err)
	}
	mode := "read-only (no --token, no --trusted-header)"
	if cfg.Token != "" || cfg.TrustedHeader != "" {
		mode = "actions on"
	}
	fmt.Fprintf(stderr, "replay console: serving http://%s/ (%s)\n", ln.Addr(), mode)
	if o.Listening != nil {
		o.Listening(ln.Addr().String())
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// keyLayout parses --key-layout.
func keyLayout(s string) (pgstore.Layout, bool) {
	switch s {
	case "", "partitioned":
		return pgstore.LayoutPartitioned, true
	case "single":
		return pgstore.LayoutSingleTable, true
	}
	return 0, false
}
