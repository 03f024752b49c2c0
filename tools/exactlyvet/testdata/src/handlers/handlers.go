package handlers

import (
	"context"
	"database/sql"
	"errors"
	"net/http"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/httpkey"
)

var table = "UPDATE t SET n = 1"

var (
	pool *pgxpool.Pool
	conn *pgx.Conn
	db   *sql.DB
)

// A per-message handler (consumer.TxHandlerFunc, worker.Config.Handler).
func apply(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
	if _, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1"); err != nil {
		return nil, err
	}
	pool.Exec(ctx, "INSERT INTO audit VALUES (1)")           // want `pool.Exec on a \*pgxpool.Pool in a handler given a transaction`
	pool.QueryRow(ctx, "UPDATE t SET n = n + 1 RETURNING n") // want `pool.QueryRow on a \*pgxpool.Pool`
	pool.QueryRow(ctx, "SELECT n FROM t")                    // a read: fine
	conn.Exec(ctx, "DELETE FROM t")                          // want `conn.Exec on a \*pgx.Conn`
	db.ExecContext(ctx, "INSERT INTO t VALUES (1)")          // want `db.ExecContext on a \*sql.DB`
	pool.Begin(ctx)                                          // want `pool.Begin on a \*pgxpool.Pool`
	pool.Exec(ctx, "INSERT INTO audit VALUES (2)")           //exactlyvet:ignore a best-effort log, applied twice on purpose
	tx.Commit(ctx)                                           // want `tx.Commit in a handler: the handler's transaction belongs to exactly`
	defer tx.Rollback(ctx)                                   // want `tx.Rollback in a handler`
	msg.Ack()                                                // want `msg.Ack in a handler: exactly acks a message after its transaction commits`
	msg.Nack()                                               // want `msg.Nack in a handler`
	return nil, nil
}

// A transaction the handler opened on a connection of its own is not the
// handler's: only the Begin is reported.
func ownTx(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
	other, _ := conn.Begin(ctx) // want `conn.Begin on a \*pgx.Conn`
	other.Commit(ctx)
	return nil, nil
}

// A function literal of the handler's shape.
var lit = consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
	go func() {
		pool.Exec(ctx, "INSERT INTO t VALUES (1)") // want `pool.Exec on a \*pgxpool.Pool`
	}()
	return nil, tx.Commit(ctx) // want `tx.Commit in a handler`
})

// A Watermill handler that takes its transaction from the message.
func fromContext(msg *message.Message) ([]*message.Message, error) {
	tx, ok := consumer.Tx(msg)
	if !ok {
		return nil, errors.New("no tx")
	}
	pool.Exec(msg.Context(), "UPDATE t SET n = 1") // want `pool.Exec on a \*pgxpool.Pool`
	return nil, tx.Commit(msg.Context())           // want `tx.Commit in a handler`
}

// An HTTP handler behind httpkey.
func pay(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx := httpkey.Tx(ctx)
	tx.Exec(ctx, "INSERT INTO payments VALUES (1)")
	pool.Exec(ctx, "INSERT INTO payments VALUES (1)") // want `pool.Exec on a \*pgxpool.Pool`
	tx.Commit(ctx)                                    // want `tx.Commit in a handler`
	httpkey.Tx(ctx).Rollback(ctx)                     // want `httpkey.Tx\(…\).Rollback in a handler`
}

// Not a handler: no transaction is handed to it.
func setup(ctx context.Context, msg *message.Message) {
	pool.Exec(ctx, "CREATE TABLE t (n int)")
	msg.Ack()
}

// A helper given the handler's transaction but no message is not a handler.
func helper(ctx context.Context, tx pgx.Tx) error {
	pool.Exec(ctx, "INSERT INTO t VALUES (1)")
	return tx.Commit(ctx)
}

// Batch handlers (consumer.BatchHandlerFunc, worker.Config.BatchHandler).

func batchGood(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
	for _, m := range msgs {
		if _, err := tx.Exec(ctx, "UPDATE t SET n = n + 1 WHERE id = $1", m.UUID); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func batchIndexed(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
	ids := make([]string, len(msgs))
	for i := 0; i < len(msgs); i++ {
		ids[i] = msgs[i].UUID
	}
	_, err := tx.Exec(ctx, "UPDATE t SET n = n + 1 WHERE id = ANY($1)", ids)
	return nil, err
}

func batchPassed(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
	return nil, applyAll(ctx, tx, msgs)
}

func applyAll(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error { return nil }

func batchFirst(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
	_, err := tx.Exec(ctx, "UPDATE t SET n = n + 1 WHERE id = $1", msgs[0].UUID) // want `batch handler reads none of its messages, or only some by constant index`
	return make([][]*message.Message, len(msgs)), err
}

func batchNone(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) { // want `batch handler reads none of its messages`
	_, err := tx.Exec(ctx, "UPDATE t SET n = n + 1")
	return nil, err
}

func batchBlank(ctx context.Context, tx pgx.Tx, _ []*message.Message) ([][]*message.Message, error) { // want `batch handler reads none of its messages`
	return nil, nil
}

var batchLit consumer.BatchHandlerFunc = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
	if len(msgs) > 0 { // want `batch handler reads none of its messages`
		return nil, tx.Rollback(ctx) // want `tx.Rollback in a handler`
	}
	return nil, nil
}
