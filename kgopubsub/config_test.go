package kgopubsub_test

import (
	"strings"
	"testing"

	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// The Subscriber refuses settings that cannot work, naming the field, before
// it reaches for a broker.
func TestSubscriberConfigRefusals(t *testing.T) {
	base := kafkapubsub.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}, ConsumerGroup: "g"}
	for _, c := range []struct {
		cfg  kgopubsub.SubscriberConfig
		want string
	}{
		{kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}}, InstanceID: "m"}, "InstanceID is set without ConsumerGroup"},
		{kgopubsub.SubscriberConfig{SubscriberConfig: base, GroupProtocol: "eager"}, "GroupProtocol is \"eager\""},
		// A static member's restart under KIP-848 would wait out the
		// broker's session timeout (franz-go's leave omits the instance ID).
		{kgopubsub.SubscriberConfig{SubscriberConfig: base, InstanceID: "m", GroupProtocol: kgopubsub.ProtocolConsumer}, "InstanceID is set with GroupProtocol \"consumer\""},
	} {
		if _, err := kgopubsub.NewSubscriber(&c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.cfg, err, c.want)
		}
	}
	if _, err := kgopubsub.NewSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: base, InstanceID: "m"}); err != nil {
		t.Errorf("a static member on the classic protocol: %v", err)
	}
}
