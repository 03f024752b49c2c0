package console_test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/internal/redrive"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// A dead-letter topic written in Kafka transactions (Kafka Streams or
// Connect with exactly-once, a transactional producer): the letter of an
// aborted transaction is neither listed nor redriven, the committed one is
// listed, and the page is built without waiting out its deadline on the
// transaction markers.
func TestAbortedLetterIsNotListedNorRedriven(t *testing.T) {
	db, brokers, source, dlq := servers(t)
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("txdlq-"+dlq), kgo.DefaultProduceTopic(dlq))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	write := func(id, reason string, end kgo.TransactionEndTry) {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		r := &kgo.Record{Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{
			{Key: kafkapubsub.UUIDHeader, Value: []byte(id)}, {Key: middleware.ReasonForPoisonedKey, Value: []byte(reason)},
			{Key: middleware.PoisonedTopicKey, Value: []byte(source)}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	write("0190a0e8-0000-7000-8000-0000000000b1", "ABORTED-LETTER", kgo.TryAbort)
	write("0190a0e8-0000-7000-8000-0000000000b2", "COMMITTED-LETTER", kgo.TryCommit)

	// The deadline is long: a read that waits for a record past the
	// commit marker runs into it and the page shows an error, not letters.
	c, err := console.New(db.Pool, &console.Config{Brokers: brokers, DeadLetterTopic: dlq, Schema: db.Schema, Token: "tok",
		Timeout: 20 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	_, page := get(t, srv, "")
	_, letters, _ := strings.Cut(page, "<h2>Dead letters")
	letters, _, _ = strings.Cut(letters, "<h2>Key lookup")
	if strings.Contains(letters, "ABORTED-LETTER") {
		t.Errorf("the page lists the letter of an aborted transaction:\n%s", letters)
	}
	if !strings.Contains(letters, "COMMITTED-LETTER") {
		t.Errorf("the page does not list the committed letter:\n%s", letters)
	}
	bearer := map[string]string{"Authorization": "Bearer tok"}
	for _, off := range []string{"0", "1", "3"} { // the aborted letter, its abort marker, the commit marker
		code, body := post(t, srv, url.Values{"action": {"redrive"}, "partition": {"0"}, "offset": {off}}, bearer)
		if code == 200 {
			t.Errorf("redrive of offset %s (no committed letter there): %d %s", off, code, strings.TrimSpace(body))
		}
	}
	code, body := post(t, srv, url.Values{"action": {"redrive"}, "partition": {"0"}, "offset": {"2"}}, bearer)
	if code != 200 {
		t.Fatalf("redrive of the committed letter: %d %s", code, strings.TrimSpace(body))
	}
	recs := kafkatest.ReadAll(t, source, 1, 5*time.Second)
	if len(recs) != 1 || redrive.Of(recs[0]).ID != "0190a0e8-0000-7000-8000-0000000000b2" {
		t.Errorf("%s holds %d records, want the committed letter alone: %+v", source, len(recs), recs)
	}
}
