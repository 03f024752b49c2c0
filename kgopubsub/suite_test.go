package kgopubsub_test

import (
	"os"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

func TestMain(m *testing.M) { subtest.Main(m, contractVariants[os.Getenv(subtest.VariantEnv)]) }

// contractVariant is kgopubsub's Transport with other settings, for the
// contract suite: static members get an InstanceID of their own each.
type contractVariant struct {
	kgopubsub.Transport
	name   string
	static bool
}

func (v contractVariant) Variant() string { return v.name }

// SkipReason skips, under KIP-848, the test whose second member must take
// partitions over while the first still has work: the broker assigns to a
// joining member at its heartbeat interval (5s at least), by when the
// first has applied every command. TestRebalanceWithoutLossOrDuplicateKIP848 moves partitions
// under load on KIP-848 instead.
func (v contractVariant) SkipReason(test string) string {
	if v.Transport.GroupProtocol == kgopubsub.ProtocolConsumer && test == "KeyOrderedRebalanceExactlyOnce" {
		return "KIP-848 assigns to a joining member at the broker's heartbeat interval (5s at least), after the first member applied every command; TestRebalanceWithoutLossOrDuplicateKIP848 covers its rebalance"
	}
	return ""
}

func (v contractVariant) NewSubscriber(c *kafkapubsub.SubscriberConfig) (message.Subscriber, error) {
	t := v.Transport
	if v.static {
		t.InstanceID = kafkatest.Name("member")
	}
	return t.NewSubscriber(c)
}

// contractVariants are the Transports the contract suite runs on, by the
// name their worker processes get in subtest.VariantEnv.
var contractVariants = map[string]subtest.Transport{
	"":       kgopubsub.Transport{},
	"kip848": contractVariant{Transport: kgopubsub.Transport{GroupProtocol: kgopubsub.ProtocolConsumer}, name: "kip848"},
	"static": contractVariant{name: "static", static: true},
}

// The subscriber contract suite (internal/testkit/subtest), which
// kafkapubsub's Subscriber passes too, through the Transport a worker
// takes: on the classic protocol with cooperative-sticky assignment, on
// KIP-848's (the broker assigns), and with static members.
func TestSubscriberContract(t *testing.T) { subtest.Run(t, contractVariants[""]) }

func TestSubscriberContractKIP848(t *testing.T) {
	requireKIP848(t)
	subtest.Run(t, contractVariants["kip848"])
}

func TestSubscriberContractStatic(t *testing.T) { subtest.Run(t, contractVariants["static"]) }
