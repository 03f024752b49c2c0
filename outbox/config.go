package outbox

import (
	"fmt"
	"log/slog"
	"time"
)

// RelayConfig configures a Relay.
type RelayConfig struct {
	Config
	// BatchSize is the most rows one batch publishes, over the lanes the
	// relay holds; a batch reads up to twice as many. Defaults to 100.
	BatchSize int
	// PollInterval is the polling floor when no notification arrives.
	// Defaults to 1s. It bounds the wait of a message whose producer did
	// not notify (see the package doc), and is the publishing latency when
	// the NOTIFY trigger is disabled.
	PollInterval time.Duration
	// PollOnly turns LISTEN/NOTIFY off: the relay polls every PollInterval
	// and never registers as a waiter, so producers never notify (River's
	// PollOnly). A relay whose pool goes through a connection pooler
	// (PgBouncer, most managed proxies), which may run in transaction mode,
	// where a LISTEN registration stays on a server session the relay no
	// longer holds, polls only whatever this says; Run finds out at start
	// (the server session's process ID is not the one the connection was
	// given at start-up) and logs it. Publishing latency is then up to PollInterval
	// (docs/deployments.md, "Behind a connection pooler"). Defaults to
	// false.
	PollOnly bool
	// RetryBackoff is the first pause before a failed message is tried
	// again; it doubles per attempt up to MaxRetryBackoff. Defaults to
	// 100ms and 1m.
	RetryBackoff, MaxRetryBackoff time.Duration
	// MaxAttempts moves a message that failed this many times to the DEAD
	// status, where operators see it (Stats, the table's last_error). A
	// DEAD message holds the later messages of its key until an operator
	// retries or removes it (see the package doc). Defaults to 10.
	MaxAttempts int
	// DeletePublished deletes rows once published instead of marking them
	// PUBLISHED (and deleting them after PublishedRetention). Defaults to false.
	DeletePublished bool
	// PublishedRetention is how long PUBLISHED rows are kept, for audits.
	// Defaults to 24h.
	PublishedRetention time.Duration
	// StatementTimeout bounds each of the relay's database calls (a
	// connection taken from the pool, a read, a lane lock, a failure
	// recorded, a registration; a lane wait gets PollInterval more), so
	// that a connection whose peer is silently gone fails the pass, which
	// is tried again on a new connection, instead of blocking the relay
	// forever. The LISTEN connection waits for notifications as long as
	// they take, and after StatementTimeout without one checks that its
	// peer still answers. Marking a published batch keeps its own minute,
	// on a connection taken within StatementTimeout (else on the relay's
	// own). Defaults to 30s.
	StatementTimeout time.Duration
	// Hooks receives an event per batch. Defaults to none.
	Hooks Hooks
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *RelayConfig) withDefaults(schema string) (RelayConfig, string, error) {
	var o RelayConfig
	if c != nil {
		o = *c
	}
	base, table, err := o.Config.withDefaults(schema)
	if err != nil {
		return o, "", err
	}
	o.Config = base
	if o.BatchSize == 0 {
		o.BatchSize = 100
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.PollInterval, time.Second)
	def(&o.RetryBackoff, 100*time.Millisecond)
	def(&o.MaxRetryBackoff, time.Minute)
	def(&o.PublishedRetention, 24*time.Hour)
	def(&o.StatementTimeout, 30*time.Second)
	if o.MaxAttempts == 0 {
		o.MaxAttempts = 10
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	for _, f := range []struct {
		name string
		v    int64
		show any
	}{
		{"BatchSize", int64(o.BatchSize), o.BatchSize}, {"MaxAttempts", int64(o.MaxAttempts), o.MaxAttempts},
		{"PollInterval", int64(o.PollInterval), o.PollInterval}, {"RetryBackoff", int64(o.RetryBackoff), o.RetryBackoff},
		{"MaxRetryBackoff", int64(o.MaxRetryBackoff), o.MaxRetryBackoff},
		{"PublishedRetention", int64(o.PublishedRetention), o.PublishedRetention},
		{"StatementTimeout", int64(o.StatementTimeout), o.StatementTimeout},
	} {
		if f.v < 0 {
			return o, "", fmt.Errorf("outbox: RelayConfig.%s is %v: sizes and durations must not be negative: leave it 0 for its default", f.name, f.show)
		}
	}
	return o, table, nil
}
