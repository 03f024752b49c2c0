package worker

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// pubsub returns the Subscriber and the Publisher, the configured ones or
// the worker's own on Brokers.
func (w *Worker) pubsub() (message.Subscriber, message.Publisher, error) {
	transport := w.cfg.Transport
	if transport == nil {
		transport = kafkaGo{}
	}
	pub := w.cfg.Publisher
	if pub == nil {
		p, err := transport.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: w.cfg.Brokers, Security: w.cfg.Security,
			Partitioner: w.cfg.Partitioner, Logger: w.cfg.Logger})
		if err != nil {
			return nil, nil, err
		}
		pub = p
	}
	pub = wrap(w.cfg.Plugins, pub, func(p PublisherPlugin, pub message.Publisher) message.Publisher { return p.Publisher(pub) })
	sub := w.cfg.Subscriber
	if sub == nil {
		inFlight := w.cfg.MaxInFlight
		if w.cfg.BatchHandler != nil {
			inFlight = w.cfg.BatchSize
		}
		scfg := &kafkapubsub.SubscriberConfig{Brokers: w.cfg.Brokers, Security: w.cfg.Security, ConsumerGroup: w.cfg.Group,
			Logger: w.cfg.Logger, MaxInFlight: inFlight, KeyOrdered: w.cfg.KeyOrdered}
		if !w.cfg.NoPositions {
			scfg.Positions = w.store.Positions()
		}
		if w.cfg.SessionTimeout > 0 {
			scfg.SessionTimeout, scfg.HeartbeatInterval = w.cfg.SessionTimeout, w.cfg.SessionTimeout/10
		}
		s, err := transport.NewSubscriber(scfg)
		if err != nil {
			_ = pub.Close()
			return nil, nil, err
		}
		sub = s
	}
	if h, ok := sub.(subscriberHealth); ok {
		w.subHealth = h.Health
	}
	sub = wrap(w.cfg.Plugins, sub, func(p SubscriberPlugin, sub message.Subscriber) message.Subscriber { return p.Subscriber(sub) })
	return sub, pub, nil
}

// closeOwn closes the configured Subscriber and Publisher when Run ends
// before it used them.
func (w *Worker) closeOwn() {
	if w.cfg.Subscriber != nil {
		_ = w.cfg.Subscriber.Close()
	}
	if w.cfg.Publisher != nil {
		_ = w.cfg.Publisher.Close()
	}
}

// refuseOutputs is the outputs writer of a worker with no OutputTopic.
type refuseOutputs struct{}

func (refuseOutputs) WriteOutputsTx(_ context.Context, _ pgx.Tx, msgs []*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the handler returned %d output message(s) and worker.Config.OutputTopic is empty: set it to their topic",
		dedupe.ErrMisconfigured, len(msgs))
}

// refusePublisher is the router's publisher for the handler: outputs go
// through the outbox, never through it.
type refusePublisher struct{}

func (refusePublisher) Publish(topic string, msgs ...*message.Message) error {
	return fmt.Errorf("%w: %d output message(s) for %q reached the router instead of the outbox", dedupe.ErrMisconfigured, len(msgs), topic)
}

func (refusePublisher) Close() error { return nil }
