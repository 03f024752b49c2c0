package kgopubsub

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kgoLogger bridges franz-go's logger into slog, one level down: franz-go
// logs every join at INFO.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel {
	switch {
	case k.l.Enabled(context.Background(), slog.LevelDebug):
		return kgo.LogLevelInfo
	case k.l.Enabled(context.Background(), slog.LevelInfo):
		return kgo.LogLevelWarn
	default:
		return kgo.LogLevelError
	}
}

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		l = slog.LevelWarn
	case kgo.LogLevelWarn:
		l = slog.LevelInfo
	}
	k.l.Log(context.Background(), l, "franz-go: "+msg, keyvals...)
}

func kerrOf(code int16) error { return kerr.ErrorForCode(code) }
