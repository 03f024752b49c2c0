package ledger_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// A top-up accepted by the API, applied by the worker, then lost from the
// API's side by a restore of the database to before the request committed:
// the client's retry with its key runs the request again, and its command
// goes out again under the same command ID, which the worker finds
// applied. Before, the API minted a new ID and the top-up of 100 was
// applied twice (balance 200), per message and in batch mode.
func TestAPIRetryAfterRestoreAppliesOnce(t *testing.T) {
	for _, batch := range []int{0, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			brokers := kafkatest.Brokers(t)
			db := pgtest.New(t)
			ctx := context.Background()
			if err := ledger.Setup(ctx, db.Pool, db.Schema); err != nil {
				t.Fatal(err)
			}
			commands, group := kafkatest.Topic(t, 1), kafkatest.Name("g")
			quiet := slog.New(slog.DiscardHandler)
			w, err := ledger.NewWorker(db.Pool, ledger.Config{Schema: db.Schema, Brokers: brokers, Commands: commands, Batch: batch,
				Events: kafkatest.Topic(t, 1), DeadLetter: kafkatest.Topic(t, 1), Group: group, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- w.Run(wctx) }()
			defer func() { cancel(); <-done }()
			api, err := ledger.NewAPI(ctx, db.Pool, ledger.APIConfig{Schema: db.Schema, Commands: commands, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(api)
			defer srv.Close()
			topup := func() string {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/accounts/acc-1/topup", strings.NewReader(`{"amount":100}`))
				req.Header.Set("Idempotency-Key", `"topup-1"`)
				req.Header.Set("X-Client", "c")
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusAccepted {
					t.Fatalf("top-up: %d %s", resp.StatusCode, b)
				}
				return string(b)
			}
			balance := func() int64 {
				got, err := ledger.Balances(ctx, db.Pool, db.Schema)
				if err != nil {
					t.Fatal(err)
				}
				return got["acc-1"].Available
			}
			first := topup()
			testenv.WaitFor(t, time.Minute, "the top-up applied", func() bool { return balance() == 100 })
			// The restore: the request's key and its outbox row are gone;
			// the command it sent is still in Kafka.
			db.DeleteKeys(t, ledger.APIScope)
			if _, err := db.Pool.Exec(ctx, "DELETE FROM "+db.Table("exactly_outbox")); err != nil {
				t.Fatal(err)
			}
			if again := topup(); again != first {
				t.Fatalf("the request applied again answered %s, first %s: its command differs", again, first)
			}
			testenv.WaitFor(t, time.Minute, "the second command consumed", func() bool {
				return kafkatest.EndOffsets(t, commands, 1)[0] == 2 && kafkatest.CommittedOffsets(t, group, commands, 1)[0] == 2
			})
			if b := balance(); b != 100 {
				t.Fatalf("balance %d after the retry, want 100: the top-up was applied twice", b)
			}
		})
	}
}
