package console

import (
	"context"
	_ "embed"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/internal/redrive"
	"github.com/exactly-go/exactly/outbox"
)

//go:embed page.html
var pageHTML string

var pageTemplate = template.Must(template.New("console").Funcs(template.FuncMap{
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format(time.RFC3339) + " (" + time.Since(t).Round(time.Second).String() + " ago)"
	},
	"dur":  func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"text": func(b []byte) string { return clip(string(b)) },
	"off": func(o int64) string {
		if o < 0 {
			return "—"
		}
		return strconv.FormatInt(o, 10)
	},
}).Parse(pageHTML))

// shownBytes is the most the page shows of a stored result, a letter's
// reason or key.
const shownBytes = 4096

// letterFetchBytes caps each fetch of the dead letters the page lists.
const letterFetchBytes = 1 << 20

// pagesAtOnce is how many GETs build the page at once; more are answered
// 503 with Retry-After.
const pagesAtOnce = 4

// clip cuts s to shownBytes, saying how long it was.
func clip(s string) string {
	if len(s) > shownBytes {
		return strings.ToValidUTF8(s[:shownBytes], "") + "… (" + strconv.Itoa(len(s)) + " bytes)"
	}
	return s
}

// Partition is where one partition of a commands topic stands.
type Partition struct {
	Topic     string
	Partition int
	// Committed is the group's committed offset in Kafka; -1 when none.
	Committed int64
	// Position is the group's position in the database
	// (exactly_positions); -1 when none.
	Position int64
	// End is the partition's log-end offset.
	End int64
	// Lag is End minus the lower of Committed and Position: the records
	// not yet applied; -1 with NoGroup.
	Lag int64
	// NoGroup is set when no consumer group is configured (Config.Group
	// empty): what was applied is not known, and Lag is -1, not End.
	NoGroup bool
	// Gap is Position minus Committed (when both are known): above 0,
	// Kafka's commit is behind the database; below 0, the database lost
	// commits and the consumer applies again from Position.
	Gap    int64
	HasGap bool
}

// outboxRow is one row of the outbox.
type outboxRow struct {
	ID        int64
	Topic     string
	Key       string // the partition key it holds back
	UUID      string
	Attempts  int
	LastError string
	CreatedAt time.Time
}

// lookupView is the key lookup's form and answer.
type lookupView struct {
	Kind, Scope, Key, Principal string
	Asked                       bool
	Record                      *dedupe.Record
	Err                         string
}

// view is what the page renders.
type view struct {
	Now                  time.Time
	Cfg                  Config
	Actions              bool
	CSRF                 string
	NeedToken            bool
	Note                 string
	Health               string
	HealthOK, HealthKnow bool
	Partitions           []Partition
	PartitionsErr        string
	Outbox               outbox.Stats
	OutboxErr            string
	Oldest               *outboxRow
	Dead                 []outboxRow
	Letters              []redrive.Letter
	LettersErr           string
	Keys                 dedupe.Stats
	KeysErr              string
	Lookup               lookupView
}

func (c *Console) page(w http.ResponseWriter, r *http.Request) {
	select {
	case c.pages <- struct{}{}:
		defer func() { <-c.pages }()
	default:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "console: "+strconv.Itoa(pagesAtOnce)+" pages are being built at once; try again in a second", http.StatusServiceUnavailable)
		return
	}
	q := r.URL.Query()
	v := view{Now: time.Now(), Cfg: c.cfg, Actions: c.actions(), CSRF: c.csrf, NeedToken: c.cfg.Token != "" &&
		(c.cfg.TrustedHeader == "" || r.Header.Get(c.cfg.TrustedHeader) == ""), Note: q.Get("note")}
	v.Cfg.Token = "" // never rendered
	ctx := r.Context()
	bounded := func(f func(ctx context.Context) error) string {
		ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
		if err := f(ctx); err != nil {
			return err.Error()
		}
		return ""
	}
	if c.cfg.Health != nil {
		v.HealthKnow = true
		if msg := bounded(c.cfg.Health); msg != "" {
			v.Health = msg
		} else {
			v.HealthOK = true
		}
	}
	v.PartitionsErr = bounded(func(ctx context.Context) (err error) { v.Partitions, err = c.Partitions(ctx); return err })
	v.OutboxErr = bounded(func(ctx context.Context) (err error) {
		if v.Outbox, err = c.outbox.Stats(ctx); err != nil {
			return err
		}
		v.Oldest, v.Dead, err = c.outboxRows(ctx)
		return err
	})
	v.LettersErr = bounded(func(ctx context.Context) (err error) { v.Letters, err = c.letters(ctx); return err })
	v.KeysErr = bounded(func(ctx context.Context) (err error) { v.Keys, err = c.store.Stats(ctx); return err })
	v.Lookup = lookupView{Kind: q.Get("kind"), Scope: q.Get("scope"), Key: q.Get("key"), Principal: q.Get("principal")}
	if v.Lookup.Kind != "http" {
		v.Lookup.Kind = "consumer"
	}
	if v.Lookup.Scope == "" {
		v.Lookup.Scope = c.cfg.Scope
		if v.Lookup.Kind == "http" {
			v.Lookup.Scope = c.cfg.HTTPScope
		}
	}
	if v.Lookup.Key != "" {
		v.Lookup.Asked = true
		v.Lookup.Err = bounded(func(ctx context.Context) (err error) {
			v.Lookup.Record, err = c.lookup(ctx, v.Lookup.Kind, v.Lookup.Scope, v.Lookup.Key, v.Lookup.Principal)
			return err
		})
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := pageTemplate.Execute(w, v); err != nil {
		c.cfg.Logger.Warn("console: render the page", "err", err)
	}
}

// Partitions reads where each partition of Config.Topics stands for
// Config.Group: Kafka's committed offset, the database position, the end,
// the lag and the gap. One connection of the pool at a time.
func (c *Console) Partitions(ctx context.Context) ([]Partition, error) {
	if len(c.cfg.Brokers) == 0 || len(c.cfg.Topics) == 0 {
		return nil, errors.New("no brokers or no topics configured")
	}
	cl, done := c.kafkaClient()
	defer done()
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: c.cfg.Topics})
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for _, t := range md.Topics {
		if t.Error == nil {
			counts[t.Name] = len(t.Partitions)
		}
	}
	var out []Partition
	var errs []error
	for _, topic := range c.cfg.Topics {
		n := counts[topic]
		if n == 0 {
			errs = append(errs, errors.New("topic "+topic+" not found"))
			continue
		}
		end, err := kafkaadmin.EndOffsets(ctx, cl, topic, n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		committed := map[int]int64{}
		saved := map[int]int64{}
		if c.cfg.Group != "" {
			if committed, err = kafkaadmin.Committed(ctx, cl, c.cfg.Group, topic, n); err != nil {
				errs = append(errs, err)
			}
			parts := make([]int, n)
			for p := range parts {
				parts[p] = p
			}
			if saved, err = c.store.Positions().Load(ctx, c.cfg.Group, topic, parts); err != nil {
				errs = append(errs, err)
			}
		}
		for p := range n {
			pt := Partition{Topic: topic, Partition: p, Committed: -1, Position: -1, End: end[p]}
			if o, ok := committed[p]; ok {
				pt.Committed = o
			}
			if o, ok := saved[p]; ok {
				pt.Position = o
			}
			applied := pt.Committed
			if pt.Position >= 0 && (applied < 0 || pt.Position < applied) {
				applied = pt.Position
			}
			pt.Lag = pt.End - max(applied, 0)
			if c.cfg.Group == "" {
				pt.Lag, pt.NoGroup = -1, true
			}
			if pt.Position >= 0 && pt.Committed >= 0 {
				pt.Gap, pt.HasGap = pt.Position-pt.Committed, true
			}
			out = append(out, pt)
		}
	}
	return out, errors.Join(errs...)
}

// outboxRows reads the outbox's oldest pending row and its dead rows
// (newest first, 50 at most), each with the key it holds back.
func (c *Console) outboxRows(ctx context.Context) (*outboxRow, []outboxRow, error) {
	const cols = "id, topic, coalesce(partition_key, ''), uuid, attempts, coalesce(last_error, ''), created_at"
	scan := func(sql string) ([]outboxRow, error) {
		rows, err := c.pool.Query(ctx, sql)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []outboxRow
		for rows.Next() {
			var o outboxRow
			if err := rows.Scan(&o.ID, &o.Topic, &o.Key, &o.UUID, &o.Attempts, &o.LastError, &o.CreatedAt); err != nil {
				return nil, err
			}
			out = append(out, o)
		}
		return out, rows.Err()
	}
	oldest, err := scan("SELECT " + cols + " FROM " + c.table + " WHERE status = 'PENDING' ORDER BY created_at, id LIMIT 1")
	if err != nil {
		return nil, nil, err
	}
	dead, err := scan("SELECT " + cols + " FROM " + c.table + " WHERE status = 'DEAD' ORDER BY id DESC LIMIT 50")
	if err != nil {
		return nil, nil, err
	}
	if len(oldest) == 0 {
		return nil, dead, nil
	}
	return &oldest[0], dead, nil
}

// letters reads the most recent Config.Letters records of each partition
// of Config.DeadLetterTopic, newest first, each with its reason and when
// it was redriven (exactly_redrives).
func (c *Console) letters(ctx context.Context) ([]redrive.Letter, error) {
	if len(c.cfg.Brokers) == 0 || c.cfg.DeadLetterTopic == "" {
		return nil, errors.New("no brokers or no dead-letter topic configured")
	}
	cl, done := c.kafkaClient()
	defer done()
	spans, err := redrive.Recent(ctx, cl, c.cfg.DeadLetterTopic, int64(c.cfg.Letters))
	if err != nil {
		return nil, err
	}
	var (
		mu   sync.Mutex
		list []redrive.Letter
	)
	// The page shows a letter's headers, never its value: the value is
	// dropped as it is read, each fetch is capped at letterFetchBytes, and
	// a reason or key longer than shownBytes is cut, as the stored results
	// of the key lookup are.
	err = redrive.ReadLimited(ctx, c.cfg.Brokers, c.cfg.Security, c.cfg.DeadLetterTopic, spans, letterFetchBytes, func(m kafka.Message) error {
		l := redrive.Of(m)
		l.Record = kafka.Message{}
		l.Reason, l.Key = clip(l.Reason), clip(l.Key)
		mu.Lock()
		defer mu.Unlock()
		list = append(list, l)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(list, func(a, b redrive.Letter) int {
		if c := b.Time.Compare(a.Time); c != 0 {
			return c
		}
		return int(b.Offset - a.Offset)
	})
	if err := redrive.Mark(ctx, c.pool, redrive.Table(c.cfg.Schema), c.cfg.DeadLetterTopic, list); err != nil {
		return list, errors.New("which were redriven is not known (run the migrations: exactly_redrives is migration 00010): " + err.Error())
	}
	return list, nil
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }
