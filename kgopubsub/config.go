package kgopubsub

import (
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/delivery"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// GroupProtocol is the consumer-group protocol a Subscriber joins with.
type GroupProtocol string

const (
	// ProtocolClassic is the client-driven protocol (JoinGroup and
	// SyncGroup) with the cooperative-sticky assignor: a rebalance moves
	// only the partitions that must move, and the others go on consuming.
	// The default.
	ProtocolClassic GroupProtocol = "classic"
	// ProtocolConsumer is KIP-848's broker-driven protocol
	// (ConsumerGroupHeartbeat, Kafka 4.0 and later): the coordinator
	// assigns partitions with no group-wide barrier. On a broker without it
	// the Subscriber joins with ProtocolClassic.
	ProtocolConsumer GroupProtocol = "consumer"
)

// ProtocolShare consumes as a member of a share group (KIP-932, Kafka's
// queues; Kafka 4.2 and later): the broker hands records out one by one to
// the group's members, each locked to one member until it is acknowledged
// or its lock times out. See ShareSubscriber.
const ProtocolShare GroupProtocol = "share"

// SubscriberConfig configures a Subscriber. The embedded
// kafkapubsub.SubscriberConfig has the same fields with the same meaning
// and defaults as for kafkapubsub's Subscriber (Brokers, ConsumerGroup,
// StartOffset, NackBackoff, CommitInterval, MaxInFlight, KeyOrdered,
// DrainTimeout, the group timeouts, Isolation, MaxWait, MaxBytes, Security,
// Positions, Logger); the fields below are franz-go's own.
type SubscriberConfig struct {
	kafkapubsub.SubscriberConfig
	// InstanceID makes the member static (group.instance.id): a member that
	// stops and comes back with the same InstanceID within SessionTimeout
	// gets its partitions back with no rebalance, and a static member does
	// not leave the group when it closes. Each running member needs an
	// InstanceID of its own (a pod name, a host name); two members with
	// the same one fence each other. Defaults to "": a dynamic member.
	InstanceID string
	// GroupProtocol is ProtocolClassic (the default) or ProtocolConsumer.
	// Under ProtocolConsumer the broker sets the session timeout and the
	// heartbeat interval (group.consumer.session.timeout.ms, 45s, and
	// group.consumer.heartbeat.interval.ms, 5s, by default):
	// SessionTimeout and HeartbeatInterval do not apply, and a crashed
	// member's partitions wait the broker's session timeout. InstanceID is
	// refused with it.
	GroupProtocol GroupProtocol
	// Options are further franz-go options, applied after the Subscriber's
	// own (a SASL mechanism of franz-go's, a dialer, a logger of kgo's).
	// Defaults to none.
	Options []kgo.Opt
}

func (c *SubscriberConfig) withDefaults() (SubscriberConfig, error) {
	var o SubscriberConfig
	if c != nil {
		o = *c
	}
	if len(o.Brokers) == 0 {
		return o, errors.New("kgopubsub: SubscriberConfig.Brokers is empty: set the Kafka bootstrap addresses")
	}
	if o.Positions != nil && o.ConsumerGroup == "" {
		return o, errors.New("kgopubsub: SubscriberConfig.Positions is set without ConsumerGroup: positions are kept per group; set ConsumerGroup or leave Positions nil")
	}
	if o.InstanceID != "" && o.ConsumerGroup == "" {
		return o, errors.New("kgopubsub: SubscriberConfig.InstanceID is set without ConsumerGroup: set ConsumerGroup or leave InstanceID empty")
	}
	switch o.GroupProtocol {
	case "":
		o.GroupProtocol = ProtocolClassic
	case ProtocolClassic, ProtocolConsumer:
	case ProtocolShare:
		return o, errors.New("kgopubsub: SubscriberConfig.GroupProtocol is \"share\": a share group is consumed by a ShareSubscriber; use NewShareSubscriber, or Transport with GroupProtocol ProtocolShare")
	default:
		return o, fmt.Errorf("kgopubsub: SubscriberConfig.GroupProtocol is %q: use %q or %q", o.GroupProtocol, ProtocolClassic, ProtocolConsumer)
	}
	if o.InstanceID != "" && o.GroupProtocol == ProtocolConsumer {
		// franz-go (v1.22) leaves a KIP-848 group without the instance ID,
		// which the broker refuses: the member stays in the group, and its
		// restart is refused (UNRELEASED_INSTANCE_ID) until the broker's
		// session timeout (45s by default) drops it, its partitions
		// consuming nothing all that time.
		return o, fmt.Errorf("kgopubsub: SubscriberConfig.InstanceID is set with GroupProtocol %q: a static member's restart under the KIP-848 protocol "+
			"waits out the broker's session timeout (45s by default) instead of moving nothing, as franz-go's leave omits the instance ID; "+
			"use %q for static members, or leave InstanceID empty", ProtocolConsumer, ProtocolClassic)
	}
	if o.StartOffset == 0 {
		o.StartOffset = kafkapubsub.StartFirst
	}
	if o.StartOffset != kafkapubsub.StartFirst && o.StartOffset != kafkapubsub.StartLast {
		return o, fmt.Errorf("kgopubsub: SubscriberConfig.StartOffset is %d: use kafkapubsub.StartFirst or kafkapubsub.StartLast", o.StartOffset)
	}
	if err := (delivery.Settings{NackBackoff: &o.NackBackoff, MaxNackBackoff: &o.MaxNackBackoff, SessionTimeout: &o.SessionTimeout,
		RebalanceTimeout: &o.RebalanceTimeout, DrainTimeout: &o.DrainTimeout, HeartbeatInterval: &o.HeartbeatInterval, MaxWait: &o.MaxWait,
		CommitInterval: &o.CommitInterval, MaxInFlight: &o.MaxInFlight, MaxBytes: &o.MaxBytes, Logger: &o.Logger}).Default("kgopubsub"); err != nil {
		return o, err
	}
	switch o.Isolation {
	case 0:
		o.Isolation = kafkapubsub.ReadCommitted
	case kafkapubsub.ReadCommitted, kafkapubsub.ReadUncommitted:
	default:
		return o, fmt.Errorf("kgopubsub: SubscriberConfig.Isolation is %d: use kafkapubsub.ReadCommitted or kafkapubsub.ReadUncommitted", o.Isolation)
	}
	return o, nil
}

// SecurityOptions turns sec, the TLS and SASL of kafkapubsub's
// configurations, into franz-go options: those of the Subscriber and the
// Publisher, for a kgo.Client of one's own beside them (an admin client,
// say).
func SecurityOptions(sec kafkapubsub.Security) []kgo.Opt {
	var opts []kgo.Opt
	if sec.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(sec.TLS.Clone()))
	}
	if sec.SASL != nil {
		opts = append(opts, kgo.SASL(fromKafkaGo(sec.SASL)))
	}
	return opts
}

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("kgopubsub: subscriber closed")

// partitionWatch is how often a Subscriber's clients refresh the topic's
// metadata, and so find partitions added to it.
const partitionWatch = 5 * time.Second
