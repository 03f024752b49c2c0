package kafkapubsub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// CheckTopics verifies that every topic exists on the brokers, for a worker
// to call at start-up with its dead-letter topic (and the others it needs).
// A dead-letter topic that does not exist is found only at the first
// permanent error otherwise, and that message then stays where it is,
// retried, until the topic is created. sec may be the zero Security.
func CheckTopics(ctx context.Context, brokers []string, sec Security, topics ...string) error {
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: sec.transport()}
	res, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("kafkapubsub: check topics %v: %w", topics, err)
	}
	found := map[string]error{}
	for _, t := range res.Topics {
		found[t.Name] = t.Error
	}
	var errs []error
	for _, topic := range topics {
		terr, ok := found[topic]
		switch {
		case !ok || errors.Is(terr, kafka.UnknownTopicOrPartition):
			errs = append(errs, fmt.Errorf("kafkapubsub: topic %q does not exist: create it (a dead-letter topic must exist before "+
				"the first permanent error, or that message is retried until it does)", topic))
		case terr != nil:
			errs = append(errs, fmt.Errorf("kafkapubsub: topic %q: %w", topic, terr))
		}
	}
	return errors.Join(errs...)
}
