package kgopubsub

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/kafkapubsub"
)

// Transport makes kgopubsub Subscribers and Publishers from kafkapubsub's
// configurations, so that code which configures kafkapubsub (the worker,
// the relay, replay) can take franz-go through one value:
//
//	var t interface {
//		NewSubscriber(*kafkapubsub.SubscriberConfig) (message.Subscriber, error)
//		NewPublisher(*kafkapubsub.PublisherConfig) (message.Publisher, error)
//	} = kgopubsub.Transport{InstanceID: os.Getenv("POD_NAME")}
//
// Its fields are the franz-go settings that kafkapubsub's configurations
// do not have.
type Transport struct {
	// InstanceID, GroupProtocol and Options are SubscriberConfig's.
	// GroupProtocol ProtocolShare makes ShareSubscribers: the commands
	// are consumed from a share group (see ShareSubscriber).
	InstanceID    string
	GroupProtocol GroupProtocol
	Options       []kgo.Opt
	// PublisherOptions are PublisherConfig.Options.
	PublisherOptions []kgo.Opt
}

// NewSubscriber returns a kgopubsub Subscriber with c and t's settings.
func (t Transport) NewSubscriber(c *kafkapubsub.SubscriberConfig) (message.Subscriber, error) {
	cfg := SubscriberConfig{InstanceID: t.InstanceID, GroupProtocol: t.GroupProtocol, Options: t.Options}
	if c != nil {
		cfg.SubscriberConfig = *c
	}
	if t.GroupProtocol == ProtocolShare {
		s, err := NewShareSubscriber(&cfg)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	s, err := NewSubscriber(&cfg)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// SharedGroup reports whether t's Subscribers consume a share group
// (GroupProtocol ProtocolShare): the worker then keeps no positions, and
// refuses KeyOrdered.
func (t Transport) SharedGroup() bool { return t.GroupProtocol == ProtocolShare }

// NewPublisher returns a kgopubsub Publisher with c and t's settings.
func (t Transport) NewPublisher(c *kafkapubsub.PublisherConfig) (message.Publisher, error) {
	cfg := PublisherConfig{Options: t.PublisherOptions}
	if c != nil {
		cfg.PublisherConfig = *c
	}
	return NewPublisher(&cfg)
}
