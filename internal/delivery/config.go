package delivery

import (
	"fmt"
	"log/slog"
	"time"
)

// Settings points at the fields of a subscriber's configuration that both
// transports default and check alike (kafkapubsub.SubscriberConfig's,
// which kgopubsub's embeds).
type Settings struct {
	// The durations: zero takes the default, a negative one is refused.
	NackBackoff, MaxNackBackoff, SessionTimeout, RebalanceTimeout *time.Duration
	DrainTimeout, HeartbeatInterval, MaxWait, CommitInterval      *time.Duration
	// MaxInFlight (1 by default, 1 or more) and MaxBytes (10 MiB by
	// default).
	MaxInFlight, MaxBytes *int
	// Logger defaults to slog.Default().
	Logger **slog.Logger
}

// Default fills in the defaults of the fields f points at and checks
// them; name (the transport's package) starts its errors.
func (f Settings) Default(name string) error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(f.NackBackoff, 100*time.Millisecond)
	def(f.MaxNackBackoff, 5*time.Second)
	def(f.SessionTimeout, 10*time.Second)
	def(f.RebalanceTimeout, 30*time.Second)
	def(f.DrainTimeout, min(10*time.Second, *f.RebalanceTimeout/2))
	def(f.HeartbeatInterval, time.Second)
	def(f.MaxWait, 250*time.Millisecond)
	def(f.CommitInterval, 200*time.Millisecond)
	if *f.MaxInFlight == 0 {
		*f.MaxInFlight = 1
	}
	if *f.MaxInFlight < 0 {
		return fmt.Errorf("%s: SubscriberConfig.MaxInFlight is %d: set 1 or more (1 is one message per partition at a time)", name, *f.MaxInFlight)
	}
	if *f.MaxBytes == 0 {
		*f.MaxBytes = 10 << 20
	}
	if *f.Logger == nil {
		*f.Logger = slog.Default()
	}
	for field, d := range map[string]time.Duration{"NackBackoff": *f.NackBackoff, "MaxNackBackoff": *f.MaxNackBackoff,
		"DrainTimeout": *f.DrainTimeout, "SessionTimeout": *f.SessionTimeout, "RebalanceTimeout": *f.RebalanceTimeout,
		"HeartbeatInterval": *f.HeartbeatInterval, "MaxWait": *f.MaxWait} {
		if d < 0 {
			return fmt.Errorf("%s: SubscriberConfig.%s is %v: set a positive duration", name, field, d)
		}
	}
	if *f.DrainTimeout >= *f.RebalanceTimeout {
		return fmt.Errorf("%s: SubscriberConfig.DrainTimeout (%v) is not below RebalanceTimeout (%v): the group would finish the rebalance without this member and refuse its last commit; lower DrainTimeout or raise RebalanceTimeout", name, *f.DrainTimeout, *f.RebalanceTimeout)
	}
	if *f.HeartbeatInterval >= *f.SessionTimeout {
		return fmt.Errorf("%s: SubscriberConfig.HeartbeatInterval (%v) is not below SessionTimeout (%v): lower HeartbeatInterval (a third of SessionTimeout or less)", name, *f.HeartbeatInterval, *f.SessionTimeout)
	}
	return nil
}
