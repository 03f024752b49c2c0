package console_test

import (
	"context"
	"net"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/produce"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/internal/redrive"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// lateAcks delivers produce requests to the broker at once and returns
// their acknowledgement once release is closed (or the caller gave up): a
// broker whose acks=all round trip outlives the redrive's deadline.
type lateAcks struct {
	kafka.RoundTripper
	release chan struct{}
}

func (s lateAcks) RoundTrip(ctx context.Context, addr net.Addr, req protocol.Message) (protocol.Message, error) {
	if _, ok := req.(*produce.Request); !ok {
		return s.RoundTripper.RoundTrip(ctx, addr, req)
	}
	res, err := s.RoundTripper.RoundTrip(context.WithoutCancel(ctx), addr, req)
	select {
	case <-s.release:
		return res, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// A redrive whose publish reaches the broker but whose ack comes after the
// redrive's deadline is recorded as uncertain, not rolled back: the
// operator's retry through the console does not publish the letter again,
// says why, and the page offers Force, which does.
func TestUncertainRedriveIsNotRepeatedUnlessForced(t *testing.T) {
	db, brokers, source, dlq := servers(t)
	writeLetter(t, brokers, dlq, source, "0190a0e8-0000-7000-8000-0000000000aa", "refused")
	ctx := context.Background()

	var letter *redrive.Letter
	if err := redrive.Read(ctx, brokers, kafkapubsub.Security{}, dlq, []redrive.Span{{Partition: 0, From: 0, To: 1}}, func(m kafka.Message) error {
		l := redrive.Of(m)
		letter = &l
		return nil
	}); err != nil || letter == nil {
		t.Fatalf("read the letter: %v", err)
	}
	w := redrive.NewWriter(brokers, kafkapubsub.Security{})
	w.Transport = lateAcks{RoundTripper: kafka.DefaultTransport, release: make(chan struct{})}
	defer w.Close()
	// The deadline passes once the record is in the source topic, its ack
	// still held back (or after 30 s, when it never gets there).
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		defer cancel()
		cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			res, err := cl.ListOffsets(cctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{source: {kafka.LastOffsetOf(0)}}})
			if err == nil && len(res.Topics[source]) == 1 && res.Topics[source][0].LastOffset >= 1 {
				return
			}
			select {
			case <-cctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	done, err := redrive.One(cctx, db.Pool, redrive.Table(db.Schema), w, dlq, source, letter, false)
	if done || err == nil {
		t.Fatalf("a publish whose ack outlived the deadline: done=%v err=%v, want an error", done, err)
	}
	var state string
	if err := db.Pool.QueryRow(ctx, "SELECT state FROM "+db.Table("exactly_redrives")).Scan(&state); err != nil {
		t.Fatalf("the redrive is not recorded: %v", err)
	}
	if state != "uncertain" {
		t.Errorf("the redrive is recorded as %q, want uncertain", state)
	}

	const token = "tok"
	c, err := console.New(db.Pool, &console.Config{Brokers: brokers, DeadLetterTopic: dlq, Schema: db.Schema, Token: token, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	bearer := map[string]string{"Authorization": "Bearer " + token}
	form := url.Values{"action": {"redrive"}, "partition": {"0"}, "offset": {"0"}}
	code, body := post(t, srv, form, bearer)
	if code == 200 || !strings.Contains(body, "may have been published") {
		t.Errorf("retry of an uncertain redrive: %d %s, want a refusal that says it may have been published", code, strings.TrimSpace(body))
	}
	if recs := kafkatest.ReadAll(t, source, 1, 5*time.Second); len(recs) != 1 {
		t.Fatalf("%d records in %s after a redrive whose ack came late and its retry, want 1 (a letter is published once)", len(recs), source)
	}
	_, page := get(t, srv, "")
	_, row, _ := strings.Cut(page, `data-id="0190a0e8-0000-7000-8000-0000000000aa"`)
	row, _, _ = strings.Cut(row, "</tr>")
	if !strings.Contains(row, "may have been published") || !strings.Contains(row, `name="force"`) {
		t.Errorf("the uncertain letter's row neither says so nor offers Force:\n%s", row)
	}

	form.Set("force", "1")
	if code, body := post(t, srv, form, bearer); code != 200 {
		t.Fatalf("forced redrive: %d %s", code, strings.TrimSpace(body))
	}
	if recs := kafkatest.ReadAll(t, source, 1, 5*time.Second); len(recs) != 2 {
		t.Errorf("%d records in %s after the forced redrive, want 2", len(recs), source)
	}
	if code, body := post(t, srv, form, bearer); code != 200 || !strings.Contains(body, "already redriven") {
		t.Errorf("a second forced redrive of a letter published for certain: %d %s, want already redriven", code, strings.TrimSpace(body))
	}
}
