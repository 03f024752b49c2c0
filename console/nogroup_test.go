package console_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// With no consumer group configured (Worker.Console of a worker with a
// Subscriber of its own), what was applied is not known: the page says
// "no consumer group" instead of showing the whole topic as lag.
func TestLagWithoutGroupIsNotShown(t *testing.T) {
	kafkatest.RequireReal(t)
	db := pgtest.New(t)
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 1)
	kw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer kw.Close()
	for range 5 {
		if err := kw.WriteMessages(context.Background(), kafka.Message{Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := console.New(db.Pool, &console.Config{Brokers: brokers, Topics: []string{topic}, Schema: db.Schema, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := c.Partitions(context.Background())
	if err != nil || len(ps) != 1 {
		t.Fatalf("partitions: %+v, %v", ps, err)
	}
	if ps[0].Lag != -1 || !ps[0].NoGroup || ps[0].End != 5 {
		t.Errorf("partition without a group: %+v, want Lag -1, NoGroup and End 5", ps[0])
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	_, page := get(t, srv, "")
	_, row, _ := strings.Cut(page, "<td>"+topic+"</td>")
	row, _, _ = strings.Cut(row, "</tr>")
	if !strings.Contains(row, "no consumer group") || strings.Contains(page, `<tr class="warn"><td>`+topic) {
		t.Errorf("the partition's row shows lag without a group:\n%s", row)
	}
}
