package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// Config configures the Middleware. The zero value (or a nil *Config) is usable.
type Config struct {
	// Scope names the consumer in every key: a stable name, since keys must
	// survive deploys. Two handlers with different scopes each apply a
	// message once. A fixed Scope belongs to one handler per topic: a second
	// handler whose messages of the same topic reach a middleware with the
	// same Scope (a router-level middleware with two handlers, say) is
	// refused with an error wrapping dedupe.ErrMisconfigured, since the two
	// would skip each other's messages. Defaults to the Watermill handler's
	// name, which is per handler by construction.
	Scope string
	// AcrossTopics lets the scope's keys span topics: a message whose key
	// was applied from another topic is then a duplicate. Defaults to
	// false: such a message is held (not applied, not committed, not
	// dead-lettered, delivered again) with an error wrapping
	// dedupe.ErrMisconfigured that names Scope and both topics, and logged
	// at ERROR, since two consumers that share a Scope on different topics
	// would skip each other's messages as duplicates. Set it only when
	// copies of the same commands reach this scope on several topics on
	// purpose: a topic moved to a new one (more partitions, say) whose
	// consumers keep the Scope, so that what was applied from the old
	// topic is not applied again from the new. Consumer groups are not
	// compared here: a new group on the same topic with the same Scope
	// skips what the old one applied, which is what a group's move needs
	// and what a second service that copied the Scope must not do; a
	// worker.Worker tells the two apart at start (worker.Config.Group and
	// TakeOver; pgstore.Store.RegisterScope for a consumer built by hand).
	AcrossTopics bool
	// KeyFunc extracts the idempotency key. Defaults to KeyFromUUID.
	KeyFunc KeyFunc
	// FingerprintFunc fingerprints the payload, to catch a key reused with
	// another payload. Defaults to dedupe.RawFingerprint (SHA-256 of the
	// bytes as delivered); dedupe.JSONFingerprint suits producers whose JSON
	// serialisation is not stable.
	FingerprintFunc dedupe.FingerprintFunc
	// MissingKey is the policy for a missing or invalid key. Defaults to Reject.
	MissingKey MissingKeyPolicy
	// TTL overrides the store's key TTL for this handler when positive.
	// Defaults to the store's (7 days unless configured).
	TTL time.Duration
	// Lease switches to lease mode for handlers whose effects leave the
	// database: the key is claimed and committed first with this lease, the
	// handler runs with no transaction, and the key is completed after it.
	// Defaults to 0: transactional mode.
	Lease time.Duration
	// Outputs, when set, receives the handler's output messages in the
	// handler's transaction (a transactional outbox) instead of the router
	// publishing them; duplicates then return nothing to publish, since the
	// first run's outputs are already in the outbox. Transactional mode only.
	// Register the handler with router.AddHandler: AddConsumerHandler
	// discards a handler's outputs before any middleware sees them, and a
	// TxHandler whose outputs do not reach the middleware fails its message
	// with an error wrapping dedupe.ErrMisconfigured (its writes rolled
	// back, the message held) rather than commit it without them; a
	// handler that takes its transaction with TxFromContext is not
	// checked. Defaults to nil: outputs go back to the router.
	Outputs OutputsWriter
	// MaxAttempts bounds how often a message may fail because of itself
	// (its handler returns an error or panics while the database answers)
	// before the middleware gives up on it with an error wrapping
	// dedupe.ErrPoisonMessage, which dedupe.IsPermanent reports, so that the
	// PoisonQueue dead-letters it with its last error. Every attempt counts,
	// in-process retries (middleware.Retry) and redeliveries alike; the
	// count lives in the process and starts again after a restart. Failures
	// of the infrastructure never count, nor does an attempt cut by its
	// deadline while its handler waited for the database (a lock another
	// session holds, the disk); one cut while its handler ran the message's
	// own work does (see the package doc). A message whose Subscriber
	// counts its deliveries by every member (dedupe.DeliveriesFromContext,
	// a share group's) and says it was delivered more than twice
	// MaxAttempts times is given up on before its handler runs: deliveries
	// that ended in a crash count there (a handler that kills its process,
	// an OOM). Negative means never give up. Defaults to 10.
	MaxAttempts int
	// Hooks receives an Event per message. Defaults to none.
	Hooks Hooks
	// LogDuplicates logs each duplicate at INFO. A replay redelivers whole
	// topics, so duplicates are many and expected; Hooks count them.
	// Defaults to false: duplicates are logged at DEBUG.
	LogDuplicates bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Source returns the Kafka coordinates of a message, recorded with its
	// key and reported in Events and logs. Defaults to
	// [dedupe.SourceFromContext] on the message's context, where
	// kafkapubsub.Subscriber puts them. With another Pub/Sub, return its
	// coordinates here (watermill-kafka, for one, keeps the partition and
	// offset in the message context: kafka.MessagePartitionFromCtx and
	// kafka.MessagePartitionOffsetFromCtx).
	Source func(msg *message.Message) (dedupe.Source, bool)
}

// OutputsWriter stores a handler's output messages in its transaction.
// outbox.Writer implements it.
type OutputsWriter interface {
	WriteOutputsTx(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error
}
