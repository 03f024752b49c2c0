package kgopubsub

import (
	"context"
	"testing"

	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// A kafka-go SASL mechanism runs under franz-go's interface: PLAIN sends
// its one message and is done on the broker's answer; SCRAM's first
// message is the client-first message and its flow goes on.
func TestSASLFromKafkaGo(t *testing.T) {
	m := fromKafkaGo(plain.Mechanism{Username: "u", Password: "p"})
	if m.Name() != "PLAIN" {
		t.Fatalf("name %q", m.Name())
	}
	s, first, err := m.Authenticate(context.Background(), "127.0.0.1:9092")
	if err != nil || string(first) != "\x00u\x00p" {
		t.Fatalf("first message %q, err %v", first, err)
	}
	done, next, err := s.Challenge(nil)
	if err != nil || !done || next != nil {
		t.Fatalf("after the broker's answer: done %v, next %q, err %v; want done with nothing to send", done, next, err)
	}

	sm, err := scram.Mechanism(scram.SHA256, "u", "p")
	if err != nil {
		t.Fatal(err)
	}
	m = fromKafkaGo(sm)
	if m.Name() != "SCRAM-SHA-256" {
		t.Fatalf("name %q", m.Name())
	}
	s, first, err = m.Authenticate(context.Background(), "broker:9092")
	if err != nil || len(first) < 8 || string(first[:8]) != "n,,n=u,r" {
		t.Fatalf("client-first message %q, err %v", first, err)
	}
	if _, _, err := s.Challenge([]byte("r=wrong-nonce,s=c2FsdA==,i=4096")); err == nil {
		t.Fatal("a server-first message with a nonce not extending the client's was accepted")
	}
}
