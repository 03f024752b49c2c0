package kafkapubsub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/backoff"
)

// TopicSpec describes a topic for [CreateTopics].
type TopicSpec struct {
	// Name of the topic. Required.
	Name string
	// Partitions of a new topic. Defaults to the broker's default
	// (num.partitions).
	Partitions int
	// ReplicationFactor of a new topic. Defaults to the broker's default
	// (default.replication.factor).
	ReplicationFactor int
	// Config holds topic-level settings of a new topic, such as
	// "retention.ms" or "min.insync.replicas". Defaults to none.
	Config map[string]string
}

// CreateTopics creates the topics that do not exist yet and waits until
// every topic is in the brokers' metadata with a leader for each of its
// partitions, so that a producer or consumer started next finds them.
// A topic that exists already is not an error, and keeps its partitions and
// settings. Every other failure is reported per topic (errors.Join), the
// topic's name first. sec may be the zero Security.
func CreateTopics(ctx context.Context, brokers []string, sec Security, topics ...TopicSpec) error {
	if len(topics) == 0 {
		return nil
	}
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	if sec.TLS != nil || sec.SASL != nil {
		c.Transport = sec.Transport()
	}
	// Without TLS or SASL the client shares kafka-go's default transport
	// with the process's other kafka-go clients, whose metadata then
	// learns of the new topics at once.
	cfgs := make([]kafka.TopicConfig, 0, len(topics))
	names := make([]string, 0, len(topics))
	for _, t := range topics {
		if t.Name == "" {
			return errors.New("kafkapubsub: CreateTopics: a TopicSpec has no Name")
		}
		tc := kafka.TopicConfig{Topic: t.Name, NumPartitions: -1, ReplicationFactor: -1}
		if t.Partitions > 0 {
			tc.NumPartitions = t.Partitions
		}
		if t.ReplicationFactor > 0 {
			tc.ReplicationFactor = t.ReplicationFactor
		}
		for k, v := range t.Config {
			tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
		}
		cfgs = append(cfgs, tc)
		names = append(names, t.Name)
	}
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: cfgs})
	if err != nil {
		return fmt.Errorf("kafkapubsub: create topics %s at %s: %w", strings.Join(names, ", "), strings.Join(brokers, ","), err)
	}
	var errs []error
	for _, name := range names {
		if terr := res.Errors[name]; terr != nil && !errors.Is(terr, kafka.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("kafkapubsub: create topic %s: %w", name, terr))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// A created topic reaches the brokers' metadata a moment later; a
	// client that asks before then is told that it does not exist.
	bo := backoff.New(50*time.Millisecond, time.Second)
	for deadline := time.Now().Add(30 * time.Second); ; {
		md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: names})
		missing := names
		if err == nil {
			missing = notReady(md, names)
			if len(missing) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kafkapubsub: topics %s created but not in the metadata of %s after 30s (%v)",
				strings.Join(missing, ", "), strings.Join(brokers, ","), err)
		}
		if err := bo.Sleep(ctx); err != nil {
			return err
		}
	}
}

// notReady lists the topics of names that md does not list with
// partitions, each with a leader.
func notReady(md *kafka.MetadataResponse, names []string) []string {
	ready := map[string]bool{}
	for _, t := range md.Topics {
		if t.Error != nil || len(t.Partitions) == 0 {
			continue
		}
		led := true
		for _, p := range t.Partitions {
			led = led && p.Error == nil && p.Leader.ID >= 0 && p.Leader.Host != ""
		}
		ready[t.Name] = led
	}
	var missing []string
	for _, n := range names {
		if !ready[n] {
			missing = append(missing, n)
		}
	}
	return missing
}
