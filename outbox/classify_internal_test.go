package outbox

import (
	"errors"
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Errors of the message, not the infrastructure: each must go DEAD after
// MaxAttempts, not be retried for ever.
func TestPermanentPublishErrorsAreNotInfrastructure(t *testing.T) {
	for name, err := range map[string]error{
		"kafka-go MessageSizeTooLarge":              fmt.Errorf("kafkapubsub: publish 1 message(s) to t: %w", kafka.MessageSizeTooLarge),
		"kafka-go WriteErrors{MessageSizeTooLarge}": fmt.Errorf("kafkapubsub: publish 1 message(s) to t: %w", kafka.WriteErrors{kafka.MessageSizeTooLarge}),
		"kafka-go InvalidRecord":                    fmt.Errorf("kafkapubsub: publish 1 message(s) to t: %w", kafka.InvalidRecord),
		"kafka-go InvalidMessage (corrupt)":         fmt.Errorf("kafkapubsub: publish 1 message(s) to t: %w", kafka.InvalidMessage),
		"kafka-go InvalidTopic":                     fmt.Errorf("kafkapubsub: publish 1 message(s) to t: %w", kafka.InvalidTopic),
		"franz-go MessageTooLarge":                  fmt.Errorf("kgopubsub: publish: %w", kerr.MessageTooLarge),
		"franz-go InvalidRecord":                    fmt.Errorf("kgopubsub: publish: %w", kerr.InvalidRecord),
		"plain":                                     errors.New("payload rejected by schema registry"),
	} {
		if infrastructure(err) {
			t.Errorf("%s (%v) is classified as the infrastructure's failure: retried for ever, never DEAD", name, err)
		}
	}
}
