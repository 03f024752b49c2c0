package console_test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
)

// The dead-letter topic deleted and created again numbers its records from
// 0 again: a new letter at the offset an old one was redriven from is not
// "already redriven" (its message ID differs); the page says what happened
// at that offset and the letter is redriven.
func TestRecreatedTopicLetterAtRedrivenOffsetIsRedriven(t *testing.T) {
	db, brokers, source, dlq := servers(t)
	ctx := context.Background()
	c, err := console.New(db.Pool, &console.Config{Brokers: brokers, DeadLetterTopic: dlq, Schema: db.Schema, Token: "tok", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	bearer := map[string]string{"Authorization": "Bearer tok"}
	form := url.Values{"action": {"redrive"}, "partition": {"0"}, "offset": {"0"}}
	writeLetter(t, brokers, dlq, source, "0190a0e8-0000-7000-8000-0000000000c1", "old")
	if code, body := post(t, srv, form, bearer); code != 200 {
		t.Fatalf("redrive of the first letter: %d %s", code, strings.TrimSpace(body))
	}

	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	if _, err := cl.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{dlq}}); err != nil {
		t.Fatal(err)
	}
	// The broker deletes a topic in the background: create it again until
	// it exists, empty.
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		_, _ = cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: dlq, NumPartitions: 1, ReplicationFactor: 1}}})
		res, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{dlq: {kafka.LastOffsetOf(0)}}})
		if err == nil && len(res.Topics[dlq]) == 1 && res.Topics[dlq][0].Error == nil && res.Topics[dlq][0].LastOffset == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not created again within a minute", dlq)
		}
		<-tick.C
	}
	writeLetter(t, brokers, dlq, source, "0190a0e8-0000-7000-8000-0000000000c2", "new")
	_, page := get(t, srv, "")
	_, row, ok := strings.Cut(page, `data-id="0190a0e8-0000-7000-8000-0000000000c2"`)
	row, _, _ = strings.Cut(row, "</tr>")
	if !ok || !strings.Contains(row, "with another ID was redriven before") || !strings.Contains(row, "Redrive to "+source) {
		t.Errorf("the new letter's row neither says another letter was redriven from its offset nor offers Redrive:\n%s", row)
	}
	code, body := post(t, srv, form, bearer)
	if code != 200 || !strings.Contains(body, "redriven to "+source) {
		t.Errorf("redrive of the new letter: %d %s, want it redriven", code, strings.TrimSpace(body))
	}
	if recs := kafkatest.ReadAll(t, source, 1, 5*time.Second); len(recs) != 2 {
		t.Errorf("%d records in %s, want 2 (the old letter and the new)", len(recs), source)
	}
}
