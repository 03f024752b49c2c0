package kgopubsub

import (
	"context"
	"net"
	"strconv"

	"github.com/segmentio/kafka-go/sasl"
	kgosasl "github.com/twmb/franz-go/pkg/sasl"
)

// fromKafkaGo runs a kafka-go SASL mechanism (kafkapubsub.Security.SASL:
// kafka-go's sasl/plain, sasl/scram, sasl/aws_msk_iam_v2) on franz-go's
// connections, so that one Security serves both transports.
func fromKafkaGo(m sasl.Mechanism) kgosasl.Mechanism { return mechanism{m} }

type mechanism struct{ m sasl.Mechanism }

func (a mechanism) Name() string { return a.m.Name() }

func (a mechanism) Authenticate(ctx context.Context, host string) (kgosasl.Session, []byte, error) {
	md := &sasl.Metadata{Host: host}
	if h, p, err := net.SplitHostPort(host); err == nil {
		md.Host = h
		md.Port, _ = strconv.Atoi(p)
	}
	ctx = sasl.WithMetadata(ctx, md)
	sm, first, err := a.m.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	return session{ctx: ctx, sm: sm}, first, nil
}

type session struct {
	ctx context.Context
	sm  sasl.StateMachine
}

// Challenge answers the broker's response. kafka-go sends nothing more once
// its state machine is done; franz-go would send a returned message, so
// none is returned then.
func (s session) Challenge(resp []byte) (bool, []byte, error) {
	done, next, err := s.sm.Next(s.ctx, resp)
	if err != nil {
		return false, nil, err
	}
	if done {
		return true, nil, nil
	}
	return false, next, nil
}
