package kafkapubsub

import (
	"testing"

	"github.com/segmentio/kafka-go"
)

// A share group's copy headers (kgopubsub) are no message metadata: the
// Subscriber leaves them out, and the Publisher never writes them from it,
// so that a record forwarded or dead-lettered by a consumer group is never
// taken for a copy.
func TestShareHeadersNotMetadata(t *testing.T) {
	km := kafka.Message{Topic: "t", Headers: []kafka.Header{
		{Key: "exactly_share_origin", Value: []byte("t/0/1")}, {Key: "exactly_share_deliveries", Value: []byte("3")}, {Key: "app", Value: []byte("x")}}}
	md := toWatermill(&km, "0", nil).Metadata
	if md.Get("exactly_share_origin") != "" || md.Get("exactly_share_deliveries") != "" || md.Get("app") != "x" {
		t.Fatalf("metadata %v: want the application's header only", md)
	}
	if !reserved("exactly_share_origin") || !reserved("exactly_share_deliveries") {
		t.Fatal("a share copy's headers would be written from metadata")
	}
}
