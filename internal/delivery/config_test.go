package delivery

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

type fields struct {
	nack, maxNack, session, rebalance, drain, heartbeat, wait, commit time.Duration
	inFlight, bytes                                                   int
	logger                                                            *slog.Logger
}

func (f *fields) settings() Settings {
	return Settings{NackBackoff: &f.nack, MaxNackBackoff: &f.maxNack, SessionTimeout: &f.session, RebalanceTimeout: &f.rebalance,
		DrainTimeout: &f.drain, HeartbeatInterval: &f.heartbeat, MaxWait: &f.wait, CommitInterval: &f.commit,
		MaxInFlight: &f.inFlight, MaxBytes: &f.bytes, Logger: &f.logger}
}

// Zero fields get the transports' defaults.
func TestSettingsDefaults(t *testing.T) {
	var f fields
	if err := f.settings().Default("x"); err != nil {
		t.Fatal(err)
	}
	want := fields{nack: 100 * time.Millisecond, maxNack: 5 * time.Second, session: 10 * time.Second, rebalance: 30 * time.Second,
		drain: 10 * time.Second, heartbeat: time.Second, wait: 250 * time.Millisecond, commit: 200 * time.Millisecond,
		inFlight: 1, bytes: 10 << 20, logger: slog.Default()}
	if f != want {
		t.Fatalf("defaults %+v, want %+v", f, want)
	}
}

// Each refusal names the transport and the field.
func TestSettingsRefusals(t *testing.T) {
	for _, c := range []struct {
		name  string
		set   func(*fields)
		field string
	}{
		{"negative MaxInFlight", func(f *fields) { f.inFlight = -1 }, "SubscriberConfig.MaxInFlight is -1"},
		{"negative duration", func(f *fields) { f.wait = -time.Second }, "SubscriberConfig.MaxWait is -1s"},
		{"drain not below rebalance", func(f *fields) { f.drain, f.rebalance = 5*time.Second, 5*time.Second }, "SubscriberConfig.DrainTimeout (5s) is not below RebalanceTimeout (5s)"},
		{"heartbeat not below session", func(f *fields) { f.heartbeat, f.session = 3*time.Second, 3*time.Second }, "SubscriberConfig.HeartbeatInterval (3s) is not below SessionTimeout (3s)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var f fields
			c.set(&f)
			err := f.settings().Default("kgopubsub")
			if err == nil || !strings.HasPrefix(err.Error(), "kgopubsub: "+c.field) {
				t.Fatalf("got %v, want an error starting %q", err, "kgopubsub: "+c.field)
			}
		})
	}
}
