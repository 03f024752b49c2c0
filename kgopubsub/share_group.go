package kgopubsub

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/kafkapubsub"
)

// Share group configuration keys.
const (
	shareAutoOffsetReset = "share.auto.offset.reset"
	shareIsolationLevel  = "share.isolation.level"
	shareDeliveryLimit   = "share.delivery.count.limit"
	defaultDeliveryLimit = 5
	shareVersionFeature  = "share.version"
)

// groupRefresh is how often a subscription reads its share group's
// configuration again: its settings (a member whose settings the group no
// longer has stops), its delivery limit and its record lock.
const groupRefresh = 5 * time.Second

// ErrShareGroupSettings is Subscribe's error, and the cause a running
// subscription ends with, when the share group's start offset or isolation
// level (set on the group, for every member) is not the ShareSubscriber's.
var ErrShareGroupSettings = errors.New("kgopubsub: the share group's settings are not this ShareSubscriber's")

// ErrNoShareGroups is Subscribe's error when the brokers do not serve
// share groups.
var ErrNoShareGroups = errors.New("kgopubsub: the brokers do not serve share groups (KIP-932): they need Kafka 4.2 or later, " +
	"with share groups enabled (the share.version feature at 1 or more: kafka-features.sh upgrade --feature share.version=1)")

// groupConf is a share group's configuration: the values, and which of
// them are set on the group itself (rather than the broker's defaults).
type groupConf struct {
	values map[string]string
	set    map[string]bool
}

// settings are the share group settings s needs, by name.
func (s *ShareSubscriber) settings() map[string]string {
	want := map[string]string{shareAutoOffsetReset: "earliest", shareIsolationLevel: "read_committed"}
	if s.cfg.StartOffset == kafkapubsub.StartLast {
		want[shareAutoOffsetReset] = "latest"
	}
	if s.cfg.Isolation == kafkapubsub.ReadUncommitted {
		want[shareIsolationLevel] = "read_uncommitted"
	}
	return want
}

// settingField names the configuration field behind each setting.
var settingField = map[string]string{shareAutoOffsetReset: "StartOffset", shareIsolationLevel: "Isolation"}

// checkSettings returns an ErrShareGroupSettings error when a setting s
// needs is set on the group to another value: the group's settings apply
// to all its members, and the others depend on them.
func (s *ShareSubscriber) checkSettings(conf groupConf) error {
	var errs []string
	for _, name := range []string{shareAutoOffsetReset, shareIsolationLevel} {
		want := s.settings()[name]
		if conf.set[name] && conf.values[name] != want {
			errs = append(errs, fmt.Sprintf("its %s is %s, and this subscriber's SubscriberConfig.%s needs %s (set it to match, or "+
				"once no member depends on it: kafka-configs.sh --alter --entity-type groups --entity-name %s --add-config %s=%s)",
				name, conf.values[name], settingField[name], want, s.cfg.ConsumerGroup, name, want))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the share group %s's settings apply to every member, and a member does not change them under the others: %s; "+
		"or consume from a share group of its own", ErrShareGroupSettings, s.cfg.ConsumerGroup, strings.Join(errs, "; "))
}

// prepareGroup checks that the brokers serve share groups and that the
// group's start offset and isolation level are the configuration's, sets
// those the group has not set yet (the first member's settings become the
// group's), and returns its configuration.
func (s *ShareSubscriber) prepareGroup(ctx context.Context, cl *kgo.Client) (groupConf, error) {
	av, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		return groupConf{}, fmt.Errorf("kgopubsub: Kafka at %s: %w", strings.Join(s.cfg.Brokers, ","), err)
	}
	served := false
	for _, k := range av.ApiKeys {
		served = served || k.ApiKey == kmsg.ShareGroupHeartbeat.Int16()
	}
	for _, f := range av.FinalizedFeatures {
		if f.Name == shareVersionFeature && f.MaxVersionLevel < 1 {
			served = false
		}
	}
	if !served {
		return groupConf{}, ErrNoShareGroups
	}
	current, err := s.describeGroup(ctx, cl)
	if err != nil {
		return groupConf{}, err
	}
	if err := s.checkSettings(current); err != nil {
		return groupConf{}, err
	}
	want := s.settings()
	set := map[string]string{}
	for name, v := range want {
		if !current.set[name] {
			set[name] = v
		}
	}
	if len(set) == 0 {
		return current, nil
	}
	if err := alterGroupConfig(ctx, cl, s.cfg.ConsumerGroup, set); err != nil {
		return groupConf{}, fmt.Errorf("kgopubsub: set the share group %s's %s and %s: %w (the role needs the AlterConfigs right on the group, or set them beforehand: kafka-configs.sh --alter --entity-type groups --entity-name %s --add-config %s=%s,%s=%s)",
			s.cfg.ConsumerGroup, shareAutoOffsetReset, shareIsolationLevel, err, s.cfg.ConsumerGroup,
			shareAutoOffsetReset, want[shareAutoOffsetReset], shareIsolationLevel, want[shareIsolationLevel])
	}
	// Another member that set them at the same time with other values: the
	// last one set holds, and the other member is refused.
	if current, err = s.describeGroup(ctx, cl); err != nil {
		return groupConf{}, err
	}
	return current, s.checkSettings(current)
}

// alterGroupConfig sets the configurations set of group, and leaves its
// others as they are.
func alterGroupConfig(ctx context.Context, cl *kgo.Client, group string, set map[string]string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	for name, v := range set {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value = name, kmsg.StringPtr(v)
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) != 1 {
		err = errors.New("no answer for the group")
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	return err
}

// describeGroup returns the share group's configuration.
func (s *ShareSubscriber) describeGroup(ctx context.Context, cl *kgo.Client) (groupConf, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, s.cfg.ConsumerGroup
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) != 1 {
		err = errors.New("no answer for the group")
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		return groupConf{}, fmt.Errorf("kgopubsub: read the share group %s's configuration: %w (the role needs the DescribeConfigs right on the group)", s.cfg.ConsumerGroup, err)
	}
	out := groupConf{values: map[string]string{}, set: map[string]bool{}}
	for _, c := range resp.Resources[0].Configs {
		if c.Value != nil {
			out.values[c.Name] = *c.Value
			out.set[c.Name] = c.Source == kmsg.ConfigSourceGroupConfig
		}
	}
	return out, nil
}

// setGroupConf keeps the group's delivery limit, and returns
// checkConnIdle's verdict on its record lock (Subscribe refuses it, a
// refresh logs it).
func (sub *shareSub) setGroupConf(conf groupConf) error {
	n, err := strconv.Atoi(conf.values[shareDeliveryLimit])
	if err != nil || n < 1 {
		n = defaultDeliveryLimit
	}
	sub.limit.Store(int32(n))
	return checkConnIdle(sub.cl, sub.s.cfg.ConsumerGroup, conf.values)
}

// refresh reads the share group's configuration again: it returns an
// ErrShareGroupSettings error when the group's settings are no longer the
// subscription's, and keeps its delivery limit and record lock.
func (sub *shareSub) refresh() error {
	conf, err := sub.s.describeGroup(sub.ctx, sub.cl)
	if err != nil {
		if sub.ctx.Err() == nil {
			sub.s.cfg.Logger.Warn("kgopubsub: could not read the share group's configuration again", "err", err)
		}
		return nil
	}
	if err := sub.s.checkSettings(conf); err != nil {
		return err
	}
	if err := sub.setGroupConf(conf); err != nil {
		sub.s.cfg.Logger.Warn("kgopubsub: the share group's record lock changed", "err", err)
	}
	return nil
}

// shareConnIdle is how long a share group member's connection may stay
// idle before it is closed: above any lock a record is held for.
const shareConnIdle = 5 * time.Minute

// shareRecordLock is the group configuration that bounds how long a
// member holds a record it was handed.
const shareRecordLock = "share.record.lock.duration.ms"

// checkConnIdle refuses a client whose idle connection timeout (a
// kgo.ConnIdleTimeout in the Options) is not above the group's record
// lock: while a handler runs within its lock, the member's connection may
// be idle; closed, it ends the member's share session, and the broker
// releases every record the member holds, to be delivered again.
func checkConnIdle(cl *kgo.Client, group string, conf map[string]string) error {
	idle, _ := cl.OptValue(kgo.ConnIdleTimeout).(time.Duration)
	ms, err := strconv.ParseInt(conf[shareRecordLock], 10, 64)
	if err != nil {
		return nil // not reported: the broker's default, below shareConnIdle
	}
	lock := time.Duration(ms) * time.Millisecond
	if idle > lock {
		return nil
	}
	why := fmt.Sprintf("a handler that runs longer than %v would lose the records its member holds (franz-go closes the idle connection, "+
		"which ends the member's share session), and they would be delivered again", idle)
	if idle == shareConnIdle {
		return fmt.Errorf("kgopubsub: the share group %s's %s (%v) is not below the subscriber's idle connection timeout (%v): %s; "+
			"put a kgo.ConnIdleTimeout above the lock in SubscriberConfig.Options", group, shareRecordLock, lock, idle, why)
	}
	return fmt.Errorf("kgopubsub: the Options' kgo.ConnIdleTimeout (%v) is not above the share group %s's %s (%v): %s; "+
		"leave it out (the subscriber sets %v) or set it above the lock", idle, group, shareRecordLock, lock, why, shareConnIdle)
}

// checkShareOptions refuses franz-go options in cfg.Options that undo
// what the share group's member needs of its client (ConnIdleTimeout,
// which depends on the group's lock, is checkConnIdle's).
func checkShareOptions(cl *kgo.Client, cfg SubscriberConfig, topic string) error {
	var errs []string
	if n, _ := cl.OptValue(kgo.MaxConcurrentFetches).(int); n != 0 {
		errs = append(errs, fmt.Sprintf("kgo.MaxConcurrentFetches(%d) fetches ahead of the handlers: the records it acquires wait in a buffer while their locks run out, "+
			"and the broker hands them to other members; leave it out (the subscriber fetches only when it polls)", n))
	}
	if n, _ := cl.OptValue(kgo.ShareMaxRecords).(int32); int(n) != cfg.MaxInFlight {
		errs = append(errs, fmt.Sprintf("kgo.ShareMaxRecords(%d) is not MaxInFlight (%d): records acquired beyond what is handed out wait while their locks run out; "+
			"set SubscriberConfig.MaxInFlight instead", n, cfg.MaxInFlight))
	}
	if g, _ := cl.OptValue(kgo.ShareGroup).(string); g != cfg.ConsumerGroup {
		errs = append(errs, fmt.Sprintf("kgo.ShareGroup(%q) is not SubscriberConfig.ConsumerGroup (%q): set ConsumerGroup instead", g, cfg.ConsumerGroup))
	}
	if ts, _ := cl.OptValue(kgo.ConsumeTopics).([]string); len(ts) != 1 || ts[0] != topic {
		errs = append(errs, fmt.Sprintf("kgo.ConsumeTopics makes the member consume %v: a subscription consumes the topic given to Subscribe (%s) alone; leave it out", ts, topic))
	}
	if re, _ := cl.OptValue(kgo.ConsumeRegex).(bool); re {
		errs = append(errs, "kgo.ConsumeRegex: a subscription consumes the topic given to Subscribe alone; leave it out")
	}
	if d, _ := cl.OptValue(kgo.ProducerLinger).(time.Duration); d != 0 {
		errs = append(errs, fmt.Sprintf("kgo.ProducerLinger(%v) delays the copies of records near their last delivery, and a member killed meanwhile loses them; leave it out", d))
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && acks != kgo.AllISRAcks() {
		errs = append(errs, "kgo.RequiredAcks other than kgo.AllISRAcks: a copy of a record near its last delivery that the leader alone holds is lost with it, and the record with it; leave it out")
	}
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		errs = append(errs, "kgo.DisableIdempotentWrite: the copies of records near their last delivery need the idempotent producer (a retried copy is appended once); leave it out")
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("kgopubsub: SubscriberConfig.Options for the share group %s: %s", cfg.ConsumerGroup, strings.Join(errs, "; "))
}
