package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/consumertest"
)

// A batch configuration that cannot work is refused at construction, each
// with the field to fix; nothing runs.
func TestBatchConfigRefused(t *testing.T) {
	t.Parallel()
	handler := consumer.BatchHandlerFunc(func(context.Context, pgx.Tx, []*message.Message) ([][]*message.Message, error) {
		t.Error("the handler ran")
		return nil, nil
	})
	for _, tc := range []struct {
		name string
		cfg  consumer.BatchConfig
		want string
	}{
		{"no scope", consumer.BatchConfig{}, "BatchConfig.Scope is empty"},
		{"lease", consumer.BatchConfig{Config: consumer.Config{Scope: "s", Lease: time.Minute}}, "BatchConfig.Lease is set"},
		{"negative size", consumer.BatchConfig{Config: consumer.Config{Scope: "s"}, MaxSize: -1}, "BatchConfig.MaxSize is -1"},
		{"dead letters without a publisher", consumer.BatchConfig{Config: consumer.Config{Scope: "s"}, DeadLetterTopic: "dlq"},
			"DeadLetterTopic needs a Publisher"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := consumer.NewBatchConsumer(consumertest.NewMemStore(nil), handler, &tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) || c != nil {
				t.Fatalf("NewBatchConsumer: %v, %v; want an error with %q", c, err, tc.want)
			}
		})
	}
}
