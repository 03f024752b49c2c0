package replaycli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/internal/redrive"
	"github.com/exactly-go/exactly/internal/sqlident"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// RedriveConfig configures Redrive.
type RedriveConfig struct {
	Brokers []string
	// Security holds the TLS and SASL settings. Defaults to plain TCP.
	Security kafkapubsub.Security
	// DeadLetterTopic is the topic to list and redrive. Required.
	DeadLetterTopic string
	// Range selects the dead-letter records by partition, offset or time.
	Range Range
	// Reason keeps the letters whose reason contains it. Key keeps the
	// letters with this record key, ID those with this message ID.
	// Default to every letter.
	Reason, Key, ID string
	// To publishes the letters to this topic instead of the one each came
	// from (its topic_poisoned header). Defaults to the source topic.
	To string
	// Execute publishes the selected letters that were not redriven yet.
	// Defaults to false: list only.
	Execute bool
	// Force publishes again, with Execute, the letters whose earlier
	// redrive is recorded as uncertain (its publish failed or outlived
	// its deadline, and may have reached the broker: the worker's keys
	// absorb a copy). Defaults to false: they are skipped.
	Force bool
	// DatabaseURL is the database whose exactly_redrives table records the
	// redrives (migration 00010). Required with Execute; without it the
	// list does not say what was redriven.
	DatabaseURL string
	// Schema holds exactly_redrives. Defaults to the database URL's
	// search_path, else public.
	Schema string
}

// uncertainOutcome is the outcome of a letter whose redrive failed or
// outlived its deadline.
const uncertainOutcome = "uncertain: may have been published; the worker's keys absorb a copy; --force publishes it again"

// offsetReusedNote marks a letter at an offset another letter was
// redriven from.
const offsetReusedNote = "a letter at this offset with another ID was redriven before (the topic was recreated)"

// Letter is one dead-letter record.
type Letter = redrive.Letter

// RedriveReport lists the selected letters and what was done.
type RedriveReport struct {
	DeadLetterTopic string   `json:"dead_letter_topic"`
	Read            int      `json:"read"`
	Letters         []Letter `json:"letters"`
	Executed        bool     `json:"executed"`
	Redriven        int      `json:"redriven"`
	Skipped         int      `json:"skipped"`
}

// afterList, when set (by tests), runs between the list and the first
// publish.
var afterList func()

// Redrive lists a dead-letter topic's records with their reasons and, with
// Execute, publishes the selected ones back to the topic each came from as
// it arrived there: key, value and headers (the message ID among them),
// without the dead-letter headers. Each redriven record is recorded in
// exactly_redrives in a transaction committed after its publish, so a
// second run skips it; if that commit is lost, the record is published
// again with the same message ID, and the consumer's keys absorb it.
func Redrive(ctx context.Context, o RedriveConfig) (RedriveReport, error) {
	rep := RedriveReport{DeadLetterTopic: o.DeadLetterTopic, Executed: o.Execute}
	switch {
	case o.DeadLetterTopic == "":
		return rep, fmt.Errorf("%w: --dlq is required: the dead-letter topic", errUsage)
	case o.Execute && o.DatabaseURL == "":
		return rep, fmt.Errorf("%w: --execute needs --database-url (or DATABASE_URL): the redrives are recorded in its exactly_redrives table", errUsage)
	case o.To == o.DeadLetterTopic:
		return rep, fmt.Errorf("%w: --to is the dead-letter topic %s itself", errUsage, o.To)
	}
	var (
		pool  *pgxpool.Pool
		table string
	)
	if o.DatabaseURL != "" {
		var err error
		if pool, err = pgxpool.New(ctx, o.DatabaseURL); err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			return rep, fmt.Errorf("%w at %s: %v", errDatabase, Redact(o.DatabaseURL), redact.Error(err, o.DatabaseURL))
		}
		defer pool.Close()
		if o.Schema == "" {
			o.Schema = sqlident.DefaultSchema(pool.Config().ConnConfig)
		}
		table = redrive.Table(o.Schema)
	}
	k := newKafka(o.Brokers, o.Security)
	spans, err := k.resolve(ctx, o.DeadLetterTopic, o.Range)
	if err != nil {
		return rep, err
	}
	var mu sync.Mutex
	rs := make([]redrive.Span, len(spans))
	for i, sp := range spans {
		rs[i] = redrive.Span{Partition: sp.Partition, From: sp.From, To: sp.To}
	}
	// Read-committed: a letter of an aborted transaction is not listed.
	err = redrive.Read(ctx, o.Brokers, o.Security, o.DeadLetterTopic, rs, func(m kafka.Message) error {
		l := redrive.Of(m)
		mu.Lock()
		defer mu.Unlock()
		rep.Read++
		if o.Reason != "" && !strings.Contains(l.Reason, o.Reason) || o.Key != "" && l.Key != o.Key || o.ID != "" && l.ID != o.ID {
			return nil
		}
		rep.Letters = append(rep.Letters, l)
		return nil
	})
	if err != nil {
		return rep, err
	}
	slices.SortFunc(rep.Letters, func(a, b Letter) int {
		if c := a.Time.Compare(b.Time); c != 0 {
			return c
		}
		if a.Partition != b.Partition {
			return a.Partition - b.Partition
		}
		return int(a.Offset - b.Offset)
	})
	if pool != nil {
		if err := redrive.Mark(ctx, pool, table, o.DeadLetterTopic, rep.Letters); err != nil {
			return rep, fmt.Errorf("%w: %v (run the migrations: exactly_redrives is migration 00010)", errDatabase, redact.Error(err, o.DatabaseURL))
		}
	}
	if !o.Execute {
		return rep, nil
	}
	if afterList != nil {
		afterList()
	}
	w := redrive.NewWriter(o.Brokers, o.Security)
	defer w.Close()
	for i := range rep.Letters {
		l := &rep.Letters[i]
		target := o.To
		if target == "" {
			target = l.Source
		}
		switch {
		case l.RedrivenAt != nil && l.Uncertain && !o.Force:
			l.Outcome = uncertainOutcome
			rep.Skipped++
			continue
		case l.RedrivenAt != nil && !l.Uncertain:
			l.Outcome = "already redriven"
			rep.Skipped++
			continue
		case target == "":
			l.Outcome = "no source topic (give --to)"
			rep.Skipped++
			continue
		case target == o.DeadLetterTopic:
			l.Outcome = "source is the dead-letter topic"
			rep.Skipped++
			continue
		}
		done, err := redrive.One(ctx, pool, table, w, o.DeadLetterTopic, target, l, o.Force)
		if errors.Is(err, redrive.ErrUncertain) {
			l.Outcome = uncertainOutcome
			rep.Skipped++
			return rep, err
		}
		if errors.Is(err, redrive.ErrDatabase) {
			return rep, fmt.Errorf("%w: %v", errDatabase, err)
		}
		if err != nil {
			return rep, err
		}
		if done {
			l.Outcome = "redriven"
			rep.Redriven++
		} else {
			l.Outcome = "already redriven"
			rep.Skipped++
		}
	}
	return rep, nil
}
