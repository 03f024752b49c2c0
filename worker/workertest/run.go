package workertest

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/exactly-go/exactly/worker"
)

// RunFunc runs the user's own worker on the kit's servers and topics,
// consuming [Kit.Topic] as consumer group group, until ctx ends; then it
// stops and returns nil, or the error that stopped it.
type RunFunc func(ctx context.Context, group string) error

// Start runs a worker.Worker made from cfg until the test ends (or
// [Kit.Stop], [Kit.Restart], [Kit.Replay]). The kit fills in what cfg
// leaves empty: Brokers, Schema, Topic, OutputTopic and DeadLetterTopic
// (the kit's), StartupBackoff (100ms) and Logger (discarding); Group is
// always the kit's ([Kit.Group]). A Topic, OutputTopic, DeadLetterTopic or
// Schema of cfg's that is not the kit's fails the test: set them in
// [Config] instead. A configuration worker.New refuses fails the test.
func (k *Kit) Start(cfg *worker.Config) {
	k.t.Helper()
	var c worker.Config
	if cfg != nil {
		c = *cfg
	}
	for _, f := range []struct{ name, got, want string }{
		{"Topic", c.Topic, k.cfg.Topic}, {"OutputTopic", c.OutputTopic, k.cfg.OutputTopic},
		{"DeadLetterTopic", c.DeadLetterTopic, k.cfg.DeadLetterTopic}, {"Schema", c.Schema, k.schema},
	} {
		if f.got != "" && f.got != f.want {
			k.t.Fatalf("workertest: worker.Config.%s is %q, not the kit's %q: leave it empty (set workertest.Config's instead)", f.name, f.got, f.want)
		}
	}
	c.Topic, c.OutputTopic, c.DeadLetterTopic, c.Schema = k.cfg.Topic, k.cfg.OutputTopic, k.cfg.DeadLetterTopic, k.schema
	if len(c.Brokers) == 0 && c.Subscriber == nil {
		c.Brokers = k.brokers
	}
	if c.StartupBackoff <= 0 {
		c.StartupBackoff = 100 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Group = k.Group()
	if _, err := worker.New(k.pool, &c); err != nil {
		k.t.Fatalf("workertest: %v", err)
	}
	k.Run(func(ctx context.Context, group string) error {
		wc := c
		wc.Group = group
		// A replay's group takes the scope over from the first, on
		// purpose (worker.Config.TakeOver): that is what proves every
		// command a duplicate.
		wc.TakeOver = wc.TakeOver || group != c.Group
		w, err := worker.New(k.pool, &wc)
		if err != nil {
			return err
		}
		return w.Run(ctx)
	})
}

// Run runs run in a goroutine until the test ends (or [Kit.Stop],
// [Kit.Restart], [Kit.Replay]): the user's own worker, made by a
// constructor of theirs or a main package's run function, on
// [Kit.DatabaseURL] or [Kit.Pool] and [Kit.Brokers], consuming [Kit.Topic]
// as group. Its error, when it returns one, fails the test.
func (k *Kit) Run(run RunFunc) {
	k.t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.running != nil {
		k.t.Fatalf("workertest: a worker already runs: call Stop first")
	}
	if k.runner == nil {
		k.t.Cleanup(func() {
			if err := k.Stop(); err != nil {
				k.t.Errorf("workertest: the worker: %v", err)
			}
		})
	}
	k.runner = run
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	group := k.group
	go func() {
		defer close(r.done)
		r.err = run(ctx, group)
	}()
	k.running = r
}

// running is a worker the kit runs.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // once done is closed
}

// Stop stops the worker and returns its error. It waits up to
// Config.Timeout for the worker to drain and return.
func (k *Kit) Stop() error {
	k.t.Helper()
	k.mu.Lock()
	r := k.running
	k.running = nil
	k.mu.Unlock()
	if r == nil {
		return nil
	}
	r.cancel()
	select {
	case <-r.done:
		return r.err
	case <-time.After(k.cfg.Timeout):
		return fmt.Errorf("workertest: the worker did not stop within %v of its context ending", k.cfg.Timeout)
	}
}

// Restart stops the worker and starts it again in the same consumer group,
// as a deploy does: it goes on from the group's committed offsets (or its
// positions in Postgres) and applies nothing again.
func (k *Kit) Restart() {
	k.t.Helper()
	k.restart(k.Group())
}

// Replay waits until the worker has caught up, stops it, and starts it in
// a new consumer group, which consumes the whole commands topic again from
// its first record: every command is delivered again, as after a group
// reset or a consumer that replays the topic. A command the worker applied
// is a duplicate now (not applied again); one refused for good (a bad
// payload, a reused key) is dead-lettered again, since no key kept it. The
// new group takes the scope over (worker.Config.TakeOver): a worker started
// with Start does so by itself; a program of your own (Run) sets TakeOver
// when the group it is given is not the first.
func (k *Kit) Replay() {
	k.t.Helper()
	k.WaitCaughtUp()
	k.restart(k.cfg.Group + "-replay-" + suffix())
}

func (k *Kit) restart(group string) {
	k.t.Helper()
	if err := k.Stop(); err != nil {
		k.t.Fatalf("workertest: the worker: %v", err)
	}
	k.mu.Lock()
	run := k.runner
	k.group = group
	k.mu.Unlock()
	if run == nil {
		k.t.Fatalf("workertest: no worker to start again: call Start or Run first")
	}
	k.Run(run)
}
