package replaycli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
)

// copy keeps keys, headers and each partition's order; ranges select by
// partition, offset and time. A share group's copy headers are dropped: a
// record copied again is no share copy of the record they name.
func TestCopyRanges(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	src, dst := kafkatest.Topic(t, 2), kafkatest.Topic(t, 2)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: src, Balancer: &kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond}
	var recs []kafka.Message
	for i := 0; i < 40; i++ {
		recs = append(recs, kafka.Message{Key: []byte(fmt.Sprint("k", i%5)), Value: []byte(fmt.Sprint(i)),
			Headers: []kafka.Header{{Key: "_watermill_message_uuid", Value: []byte(fmt.Sprint("u", i))}, {Key: "trace", Value: []byte("t")}}})
		if i%7 == 3 {
			recs[i].Headers = append(recs[i].Headers, kafka.Header{Key: "exactly_share_origin", Value: []byte(src + "/0/1")},
				kafka.Header{Key: "exactly_share_deliveries", Value: []byte("3")})
		}
	}
	if err := w.WriteMessages(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	w.Close()
	end := kafkatest.EndOffsets(t, src, 2)

	code, out, errs := run("copy", "--json", "--brokers", brokers[0], "--from", src, "--to", dst, "--partition", "1", "--from-offset", "2", "--dry-run")
	var res replaycli.CopyResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Read != end[1]-2 || !res.DryRun {
		t.Fatalf("dry run of partition 1 from offset 2: exit %d %+v %s", code, res, errs)
	}
	if got := kafkatest.EndOffsets(t, src, 2); fmt.Sprint(got) != fmt.Sprint(end) {
		t.Fatal("a dry run wrote records")
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if code, _, errs := run("copy", "--brokers", brokers[0], "--from", src, "--to", dst, "--from-time", future); code != replaycli.ExitEmptyRange {
		t.Fatalf("range after the last record: exit %d %s", code, errs)
	}
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	if code, out, errs := run("copy", "--brokers", brokers[0], "--from", src, "--to", dst, "--from-time", past); code != 0 {
		t.Fatalf("copy: exit %d %s %s", code, out, errs)
	}
	a, b := kafkatest.ReadAll(t, src, 2, time.Minute), kafkatest.ReadAll(t, dst, 2, time.Minute)
	if len(a) != len(b) {
		t.Fatalf("copied %d of %d records", len(b), len(a))
	}
	for i := range a {
		want := a[i].Headers[:2] // the share headers, when there are any, come last
		if a[i].Partition != b[i].Partition || string(a[i].Key) != string(b[i].Key) || string(a[i].Value) != string(b[i].Value) ||
			fmt.Sprint(want) != fmt.Sprint(b[i].Headers) {
			t.Fatalf("record %d: %d/%s=%s %v became %d/%s=%s %v", i, a[i].Partition, a[i].Key, a[i].Value, a[i].Headers,
				b[i].Partition, b[i].Key, b[i].Value, b[i].Headers)
		}
	}
}
