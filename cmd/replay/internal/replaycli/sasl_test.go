package replaycli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/internal/kafkaflags"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// saslBroker starts a Kafka broker of the test's own whose only listener
// takes SASL/PLAIN, with user alice (password alice-secret).
func saslBroker(t *testing.T) string {
	t.Helper()
	return kafkatest.StartOwn(t, func(port, cport int) string {
		return strings.Join([]string{
			fmt.Sprintf("listeners=SASL_PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", port, cport),
			fmt.Sprintf("advertised.listeners=SASL_PLAINTEXT://127.0.0.1:%d", port),
			"inter.broker.listener.name=SASL_PLAINTEXT",
			"listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
			"sasl.enabled.mechanisms=PLAIN",
			"sasl.mechanism.inter.broker.protocol=PLAIN",
			`listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";`,
		}, "\n")
	}).Addr
}

// The CLI's --kafka-sasl flags reach every connection it makes: on a broker
// that takes only SASL/PLAIN, a copy works with the right password and
// fails with a wrong one, and so does the Publisher given the same
// settings through the flags.
func TestSASLFlags(t *testing.T) {
	broker := saslBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	security := func(pw string) kafkapubsub.Security {
		t.Helper()
		t.Setenv("KAFKA_SASL_PASSWORD", pw)
		f := kafkaflags.Flags{SASLMechanism: "plain", SASLUser: "alice"}
		sec, err := f.Security()
		if err != nil {
			t.Fatal(err)
		}
		return sec
	}
	publish := func(sec kafkapubsub.Security, topic string, n int) error {
		pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: []string{broker}, Security: sec,
			AllowAutoTopicCreation: true, PublishTimeout: 20 * time.Second, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("u-%d", i), []byte(`{"n":1}`))
		}
		return pub.Publish(topic, msgs...)
	}
	if err := publish(security("wrong"), "sasl-src", 1); err == nil {
		t.Fatal("published with a wrong SASL password")
	}
	// Auto-creation can race the first produce: ask again until it lands.
	deadline := time.Now().Add(time.Minute)
	for {
		err := publish(security("alice-secret"), "sasl-src", 10)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish through SASL: %v", err)
		}
	}
	c := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 20 * time.Second, Transport: security("alice-secret").Transport()}
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: "sasl-dst", NumPartitions: 1, ReplicationFactor: 1}}})
	if err != nil || res.Errors["sasl-dst"] != nil {
		t.Fatalf("create the target topic through SASL: %v %v", err, res)
	}
	run := func(pw string, args ...string) (int, string) {
		t.Setenv("KAFKA_SASL_PASSWORD", pw)
		var out, errb bytes.Buffer
		code := replaycli.Main(ctx, append(args, "--json", "--brokers", broker, "--kafka-sasl", "plain", "--kafka-sasl-user", "alice"), &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, out := run("wrong", "copy", "--from", "sasl-src", "--to", "sasl-dst"); code == replaycli.ExitOK {
		t.Fatalf("copy with a wrong SASL password succeeded: %s", out)
	}
	code, out := run("alice-secret", "copy", "--from", "sasl-src", "--to", "sasl-dst")
	if code != replaycli.ExitOK {
		t.Fatalf("copy through SASL: exit %d: %s", code, out)
	}
	var rep struct {
		Read, Written int64
	}
	if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep); err != nil || rep.Read != 10 || rep.Written != 10 {
		t.Fatalf("copy report %+v (%v): %s", rep, err, out)
	}
}
