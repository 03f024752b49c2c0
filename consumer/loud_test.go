package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/consumertest"
	"github.com/exactly-go/exactly/dedupe"
)

// Duplicates are logged at DEBUG, so that a replay of a whole topic does
// not print a line per record at INFO; Config.LogDuplicates logs them at
// INFO.
func TestDuplicatesLogAtDebug(t *testing.T) {
	t.Parallel()
	noop := consumer.TxHandler(func(context.Context, pgx.Tx, *message.Message) ([]*message.Message, error) { return nil, nil })
	for _, info := range []bool{false, true} {
		logs := &levelCounter{}
		h, err := consumertest.NewHandler(consumertest.NewMemStore(nil), noop,
			&consumer.Config{Logger: slog.New(logs), LogDuplicates: info})
		if err != nil {
			t.Fatal(err)
		}
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
		for range 3 {
			h.Run(context.Background(), t, msg.Copy())
		}
		want := 0
		if info {
			want = 2
		}
		if n := logs.atLeast(slog.LevelInfo); n != want {
			t.Errorf("LogDuplicates %v: %d records at INFO or above for 1 application and 2 duplicates, want %d", info, n, want)
		}
	}
}

// A handler's error marked with dedupe.Permanent is permanent, reported as
// rejected, and leaves no key: the message is for the dead-letter topic.
func TestPermanentHandlerErrorIsRejected(t *testing.T) {
	t.Parallel()
	reject := consumer.TxHandler(func(context.Context, pgx.Tx, *message.Message) ([]*message.Message, error) {
		return nil, dedupe.Permanent(errors.New("amount -5: want > 0"))
	})
	h, err := consumertest.NewHandler(consumertest.NewMemStore(nil), reject, &consumer.Config{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	r := h.Run(context.Background(), t, message.NewMessage(watermill.NewUUID(), []byte("p")))
	if r.Outcome != consumer.OutcomeRejected || !dedupe.IsPermanent(r.Err) || r.Stored {
		t.Fatalf("outcome %s, err %v, key stored %v: want rejected, a permanent error, no key", r.Outcome, r.Err, r.Stored)
	}
}
