package kafkapubsub_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

type kafkaGo struct{}

func (kafkaGo) NewSubscriber(cfg *kafkapubsub.SubscriberConfig) (message.Subscriber, error) {
	return kafkapubsub.NewSubscriber(cfg)
}

func TestMain(m *testing.M) { subtest.Main(m, kafkaGo{}) }

// The subscriber contract suite (internal/testkit/subtest), which
// kgopubsub's Subscriber passes too.
func TestSubscriberContract(t *testing.T) { subtest.Run(t, kafkaGo{}) }
