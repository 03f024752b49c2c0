package kafkapubsub

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// ErrTTLTooShort is returned by CheckTTL when keys may expire before the
// records they protect: a record redelivered after its key expired is
// applied again.
var ErrTTLTooShort = errors.New("kafkapubsub: key TTL shorter than the topic's retention")

// topicConfig reads one configuration value of topic.
func topicConfig(ctx context.Context, brokers []string, sec Security, topic, name string) (string, error) {
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: sec.transport()}
	res, err := c.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{name},
	}}})
	if err != nil {
		return "", fmt.Errorf("kafkapubsub: describe %s: %w", topic, err)
	}
	for _, r := range res.Resources {
		if r.Error != nil {
			return "", fmt.Errorf("kafkapubsub: describe %s: %w", topic, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == name {
				return e.ConfigValue, nil
			}
		}
	}
	return "", fmt.Errorf("kafkapubsub: describe %s: no %s in the answer", topic, name)
}

// CheckTTL compares the key TTL with topic's retention.ms. It returns an
// error wrapping ErrTTLTooShort when records outlive their keys (retention
// longer than ttl, or unlimited), for a worker to log at startup. sec may be
// the zero Security.
func CheckTTL(ctx context.Context, brokers []string, sec Security, topic string, ttl time.Duration) error {
	v, err := topicConfig(ctx, brokers, sec, topic, "retention.ms")
	if err != nil {
		return err
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return fmt.Errorf("kafkapubsub: %s retention.ms %q: %w", topic, v, err)
	}
	if ms < 0 {
		return fmt.Errorf("%w: %s keeps records forever, keys expire after %v: a replay of older records applies them again", ErrTTLTooShort, topic, ttl)
	}
	if retention := time.Duration(ms) * time.Millisecond; retention > ttl {
		return fmt.Errorf("%w: %s keeps records %v, keys expire after %v: raise the TTL to at least the retention", ErrTTLTooShort, topic, retention, ttl)
	}
	return nil
}
