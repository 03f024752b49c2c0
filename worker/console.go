package worker

import (
	"github.com/exactly-go/exactly/console"
)

// Console returns the operator console of the worker (package console):
// an http.Handler to serve beside /metrics, off until it is mounted:
//
//	c, err := w.Console(&console.Config{Token: os.Getenv("CONSOLE_TOKEN")})
//	mux.Handle("/console/", http.StripPrefix("/console", c))
//
// The worker fills in what it knows: the pool, Brokers, Security, Group,
// Topic, DeadLetterTopic, Schema, KeyLayout, Scope and Health; cfg gives
// the rest (Token or TrustedHeader for its actions: without either the
// page is read-only) and may override them. cfg may be nil.
func (w *Worker) Console(cfg *console.Config) (*console.Console, error) {
	var c console.Config
	if cfg != nil {
		c = *cfg
	}
	if len(c.Brokers) == 0 {
		c.Brokers, c.Security = w.cfg.Brokers, w.cfg.Security
	}
	if c.Group == "" && w.cfg.Subscriber == nil && !sharedGroup(&w.cfg) {
		c.Group = w.cfg.Group
	}
	if len(c.Topics) == 0 {
		c.Topics = []string{w.cfg.Topic}
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = w.cfg.DeadLetterTopic
	}
	if c.Schema == "" {
		c.Schema = w.cfg.Schema
	}
	if c.KeyLayout == 0 {
		c.KeyLayout = w.cfg.KeyLayout
	}
	if c.Scope == "" {
		c.Scope = w.cfg.Scope
	}
	if c.Health == nil {
		c.Health = w.Health
	}
	if c.Logger == nil {
		c.Logger = w.cfg.Logger
	}
	return console.New(w.pool, &c)
}
