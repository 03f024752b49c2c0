package consumer

import (
	"context"
	"errors"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
)

// outcomeErrors maps the errors of a failed message to their outcome, the
// first that matches; any other error is OutcomeFailed.
var outcomeErrors = []struct {
	err     error
	outcome Outcome
}{
	{dedupe.ErrMisconfigured, OutcomeMisconfigured},
	{dedupe.ErrKeyReused, OutcomeKeyReused},
	{dedupe.ErrInFlight, OutcomeInFlight},
	{dedupe.ErrInvalidKey, OutcomeInvalidKey},
	{dedupe.ErrInvalidPayload, OutcomeInvalidPayload},
	{dedupe.ErrResultTooLarge, OutcomeResultTooLarge},
	{dedupe.ErrPoisonMessage, OutcomePoisoned},
}

func outcomeOf(err error) Outcome {
	for _, o := range outcomeErrors {
		if errors.Is(err, o.err) {
			return o.outcome
		}
	}
	if dedupe.IsPermanent(err) {
		return OutcomeRejected
	}
	return OutcomeFailed
}

// outcomeLines is the line logged for each outcome, and its level.
var outcomeLines = map[Outcome]struct {
	level slog.Level
	text  string
}{
	OutcomeApplied:        {slog.LevelDebug, "consumer: message applied"},
	OutcomeDuplicate:      {slog.LevelDebug, "consumer: duplicate: the handler did not run again"},
	OutcomeInFlight:       {slog.LevelInfo, "consumer: key in flight on another worker: the message will be delivered again"},
	OutcomeKeyReused:      {slog.LevelWarn, "consumer: key reused with another payload: not applied, for the dead-letter topic"},
	OutcomeInvalidKey:     {slog.LevelWarn, "consumer: invalid key: not applied, for the dead-letter topic"},
	OutcomeInvalidPayload: {slog.LevelWarn, "consumer: invalid payload: not applied, for the dead-letter topic"},
	OutcomeRejected:       {slog.LevelWarn, "consumer: rejected by the handler (dedupe.Permanent): rolled back, for the dead-letter topic"},
	OutcomeResultTooLarge: {slog.LevelWarn, "consumer: result over the store's limit: rolled back, for the dead-letter topic"},
	OutcomePoisoned:       {slog.LevelError, "consumer: poison message: it failed on every attempt; rolled back, for the dead-letter topic"},
	OutcomeFailed:         {slog.LevelWarn, "consumer: handler failed: rolled back, the message will be retried"},
	OutcomeUnavailable:    {slog.LevelWarn, "consumer: database unavailable: rolled back, the message will be retried"},
	OutcomeMisconfigured:  {slog.LevelError, "consumer: configuration error: the message is retried until it is fixed"},
}

// log writes one line per message, at the outcome's level. A skipped
// message was logged at WARN where it happened.
func (m *Middleware) log(ctx context.Context, msg *message.Message, ev Event) {
	line, ok := outcomeLines[ev.Outcome]
	if ev.Outcome == OutcomeSkipped {
		return
	}
	if !ok {
		line = outcomeLines[OutcomeApplied]
	}
	if ev.Outcome == OutcomeDuplicate && m.cfg.LogDuplicates {
		line.level = slog.LevelInfo
	}
	if !m.cfg.Logger.Enabled(ctx, line.level) {
		return
	}
	attrs := []any{"key", ev.Key, "scope", ev.Scope, "topic", ev.Topic, "partition", ev.Partition, "offset", ev.Offset,
		"uuid", msg.UUID, "outcome", string(ev.Outcome), "attempts", ev.Attempts, "duration", ev.Duration}
	if ev.Err != nil {
		attrs = append(attrs, "err", ev.Err)
	}
	m.cfg.Logger.Log(ctx, line.level, line.text, attrs...)
}
