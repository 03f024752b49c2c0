// Package console is an operator's web page over a worker's state:
// server-rendered HTML (html/template, no JavaScript) that shows, per topic
// and partition, Kafka's committed offset, the database position, the lag
// and the gap; the outbox's backlog and its dead rows; the recent dead
// letters with their reasons and a redrive action; a key lookup for
// consumer and HTTP keys; the worker's health and gauges.
//
// A worker builds one with worker.Worker.Console and serves it beside
// /metrics; `replay console` serves one standalone:
//
//	c, err := w.Console(&console.Config{Token: os.Getenv("CONSOLE_TOKEN")})
//	if err != nil { … }
//	mux.Handle("/console/", http.StripPrefix("/console", c))
//
// Nothing is served unless it is mounted. The page is read-only until
// Config.Token or Config.TrustedHeader is set: its actions (POST) need the
// token (Authorization: Bearer, or the form's token field) or the header
// that a trusted proxy sets, and, from a browser, the form's anti-forgery
// field; cross-origin POSTs are refused (net/http.CrossOriginProtection).
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/internal/redrive"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// Config configures a [Console]. Everything is optional; a part whose
// settings are missing says so on the page.
type Config struct {
	// Brokers are the Kafka brokers of Topics and DeadLetterTopic.
	// Defaults to none: the page shows no offsets and no dead letters.
	Brokers []string
	// Security holds the Kafka connections' TLS and SASL settings.
	// Defaults to plain TCP.
	Security kafkapubsub.Security
	// Group is the consumer group whose committed offsets and database
	// positions are shown. Defaults to none.
	Group string
	// Topics are the topics of the commands. Defaults to none.
	Topics []string
	// DeadLetterTopic is the topic whose recent records are listed, with
	// their reasons and a redrive action. Defaults to none.
	DeadLetterTopic string
	// Schema holds exactly's tables. Defaults to the first schema of the
	// pool's search_path, else "public" (as pgstore.Config.Schema).
	Schema string
	// KeyLayout is the key table's layout (pgstore.Config.Layout), for
	// the key lookup. Defaults to pgstore.LayoutPartitioned.
	KeyLayout pgstore.Layout
	// Scope is the consumer's scope offered in the key lookup. Defaults
	// to "".
	Scope string
	// HTTPScope is the httpkey.Config.Scope of the HTTP keys in the key
	// lookup. Defaults to "http", httpkey's default.
	HTTPScope string
	// Letters is how many of the most recent dead letters are listed per
	// partition of DeadLetterTopic. Defaults to 20.
	Letters int
	// Token lets a request that carries it (Authorization: Bearer, or the
	// form's token field) take the page's actions. Compared in constant
	// time. Defaults to "": no token is accepted.
	Token string
	// TrustedHeader names a header that a trusted proxy in front of the
	// console sets on the requests of the users it authenticated (and
	// strips from every other): a request that carries it, non-empty, may
	// take the page's actions. Defaults to "": no header is trusted. With
	// neither Token nor TrustedHeader the page is read-only.
	TrustedHeader string
	// Health reports the worker's health (worker.Worker.Health). Defaults
	// to none: the page says it does not know.
	Health func(ctx context.Context) error
	// Timeout bounds each part of the page (a query, a Kafka call) and an
	// action. Defaults to 5s.
	Timeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Console serves the page. It is an http.Handler: GET renders the page
// (with ?kind=&scope=&key=&principal= a key lookup), POST takes an action.
type Console struct {
	cfg    Config
	pool   *pgxpool.Pool
	store  *pgstore.Store
	outbox *outbox.Backlog
	table  string // the outbox's, quoted
	csrf   string
	origin *http.CrossOriginProtection
	pages  chan struct{} // a slot per page being built
}

// New returns the Console of the database on pool for cfg, which may be
// nil. It connects to nothing.
func New(pool *pgxpool.Pool, cfg *Config) (*Console, error) {
	if pool == nil {
		return nil, errors.New("console: the pool is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.HTTPScope == "" {
		c.HTTPScope = "http"
	}
	if c.Letters <= 0 {
		c.Letters = 20
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TrustedHeader != "" && http.CanonicalHeaderKey(c.TrustedHeader) == "Authorization" {
		return nil, errors.New("console: Config.TrustedHeader is Authorization: name the header your proxy sets (X-Forwarded-User, say)")
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: c.Schema, Layout: c.KeyLayout, Logger: c.Logger})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	c.Schema = store.Config().Schema
	w, err := outbox.NewWriter(&outbox.Config{Schema: c.Schema})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	backlog, err := w.Backlog(pool)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	return &Console{cfg: c, pool: pool, store: store, outbox: backlog,
		table: pgx.Identifier{c.Schema, "exactly_outbox"}.Sanitize(), csrf: hex.EncodeToString(secret[:]),
		origin: http.NewCrossOriginProtection(), pages: make(chan struct{}, pagesAtOnce)}, nil
}

// Config returns the console's configuration with its defaults filled in.
func (c *Console) Config() Config { return c.cfg }

// ServeHTTP serves the page (GET, HEAD) and its actions (POST).
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("Cache-Control", "no-store")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		c.page(w, r)
	case http.MethodPost:
		c.act(w, r)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// actions says whether the page's actions are on.
func (c *Console) actions() bool { return c.cfg.Token != "" || c.cfg.TrustedHeader != "" }

// authorize returns nil when r may take an action, else the status and
// why.
func (c *Console) authorize(r *http.Request) (int, error) {
	if !c.actions() {
		return http.StatusForbidden, errors.New("actions are off: the console has neither a token (Config.Token, --token) nor a trusted proxy header (Config.TrustedHeader)")
	}
	if err := c.origin.Check(r); err != nil {
		return http.StatusForbidden, fmt.Errorf("refused: %v", err)
	}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		// A browser never sends this header cross-site on its own: no
		// anti-forgery field is needed.
		if c.cfg.Token != "" && equal(bearer, c.cfg.Token) {
			return 0, nil
		}
		return http.StatusUnauthorized, errors.New("the bearer token is wrong")
	}
	if !equal(r.PostFormValue("csrf"), c.csrf) {
		return http.StatusForbidden, errors.New("the form is stale or forged: load the page again")
	}
	if c.cfg.Token != "" && equal(r.PostFormValue("token"), c.cfg.Token) {
		return 0, nil
	}
	if c.cfg.TrustedHeader != "" && r.Header.Get(c.cfg.TrustedHeader) != "" {
		return 0, nil
	}
	return http.StatusUnauthorized, errors.New("the token is missing or wrong")
}

// equal compares a and b in constant time (for their common length).
func equal(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// act takes the action of a POST: redrive one dead letter.
func (c *Console) act(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if code, err := c.authorize(r); err != nil {
		http.Error(w, "console: "+err.Error(), code)
		return
	}
	if r.PostFormValue("action") != "redrive" {
		http.Error(w, "console: unknown action: want action=redrive", http.StatusBadRequest)
		return
	}
	part, err1 := strconv.Atoi(r.PostFormValue("partition"))
	off, err2 := strconv.ParseInt(r.PostFormValue("offset"), 10, 64)
	if err1 != nil || err2 != nil || part < 0 || off < 0 {
		http.Error(w, "console: redrive needs the dead letter's partition and offset", http.StatusBadRequest)
		return
	}
	// Not cut when the client goes away: a redrive cut between its publish
	// and its commit would be published but not recorded.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 3*c.cfg.Timeout)
	defer cancel()
	force := r.PostFormValue("force") != ""
	note, err := c.redrive(ctx, part, off, force)
	if err != nil {
		c.cfg.Logger.Warn("console: redrive failed", "topic", c.cfg.DeadLetterTopic, "partition", part, "offset", off, "err", err)
		note = "redrive of " + c.cfg.DeadLetterTopic + "/" + strconv.Itoa(part) + "/" + strconv.FormatInt(off, 10) + " failed: " + err.Error()
	} else {
		c.cfg.Logger.Info("console: redrive", "topic", c.cfg.DeadLetterTopic, "partition", part, "offset", off, "outcome", note)
	}
	if r.Header.Get("Authorization") != "" {
		// A client of its own: the outcome as text.
		if err != nil {
			http.Error(w, note, http.StatusBadGateway)
			return
		}
		_, _ = w.Write([]byte(note + "\n"))
		return
	}
	// A Location relative to the page's own URL, which the browser knows:
	// behind http.StripPrefix, r.URL.Path is not it (http.Redirect would
	// make it absolute from r.URL.Path).
	w.Header().Set("Location", "?note="+urlQueryEscape(note))
	w.WriteHeader(http.StatusSeeOther)
}

// Redrive publishes the dead letter at partition and offset of
// Config.DeadLetterTopic back to the topic it came from, as `replay
// redrive` does, and records it in exactly_redrives the same way: a
// letter redriven before is not published again. It returns what it did.
// A publish that fails or outlives ctx may have reached the broker: it is
// recorded as uncertain, and neither this redrive's error nor a second
// Redrive publishes the letter again (ForceRedrive does).
func (c *Console) Redrive(ctx context.Context, partition int, offset int64) (string, error) {
	return c.redrive(ctx, partition, offset, false)
}

// ForceRedrive is Redrive that publishes again a letter whose earlier
// redrive is recorded as uncertain (its publish failed or outlived its
// deadline, and may have reached the broker: the worker's keys absorb a
// copy). A letter redriven for certain is not published again.
func (c *Console) ForceRedrive(ctx context.Context, partition int, offset int64) (string, error) {
	return c.redrive(ctx, partition, offset, true)
}

func (c *Console) redrive(ctx context.Context, partition int, offset int64, force bool) (string, error) {
	if c.cfg.DeadLetterTopic == "" || len(c.cfg.Brokers) == 0 {
		return "", errors.New("console: no dead-letter topic or no brokers configured")
	}
	cl, closeClient := c.kafkaClient()
	offs, err := kafkaadmin.ListOffsets(ctx, cl, c.cfg.DeadLetterTopic, []kafka.OffsetRequest{kafka.FirstOffsetOf(partition), kafka.LastOffsetOf(partition)})
	closeClient()
	if err != nil {
		return "", err
	}
	if o := offs[partition]; offset < o.FirstOffset || offset >= o.LastOffset {
		return "", fmt.Errorf("console: %s/%d holds offsets %d to %d: no record at offset %d", c.cfg.DeadLetterTopic, partition, o.FirstOffset, o.LastOffset-1, offset)
	}
	var letter *redrive.Letter
	err = redrive.Read(ctx, c.cfg.Brokers, c.cfg.Security, c.cfg.DeadLetterTopic,
		[]redrive.Span{{Partition: partition, From: offset, To: offset + 1}}, func(m kafka.Message) error {
			if m.Offset == offset {
				l := redrive.Of(m)
				letter = &l
			}
			return nil
		})
	if err != nil {
		return "", err
	}
	if letter == nil {
		return "", fmt.Errorf("console: %s/%d has no record at offset %d", c.cfg.DeadLetterTopic, partition, offset)
	}
	switch {
	case letter.Source == "":
		return "", errors.New("console: the dead letter names no source topic (header topic_poisoned): redrive it with replay redrive --to")
	case letter.Source == c.cfg.DeadLetterTopic:
		return "", errors.New("console: the dead letter's source is the dead-letter topic itself")
	}
	w := redrive.NewWriter(c.cfg.Brokers, c.cfg.Security)
	defer w.Close()
	done, err := redrive.One(ctx, c.pool, redrive.Table(c.cfg.Schema), w, c.cfg.DeadLetterTopic, letter.Source, letter, force)
	if err != nil {
		return "", err
	}
	where := fmt.Sprintf("%s/%d/%d", c.cfg.DeadLetterTopic, partition, offset)
	if !done {
		return where + " was already redriven", nil
	}
	return where + " redriven to " + letter.Source, nil
}

// kafkaClient returns a client on connections of its own and the function
// that closes them.
func (c *Console) kafkaClient() (*kafka.Client, func()) {
	tr := c.cfg.Security.Transport()
	tr.DialTimeout, tr.IdleTimeout = 3*time.Second, time.Second
	return &kafka.Client{Addr: kafka.TCP(c.cfg.Brokers...), Timeout: c.cfg.Timeout, Transport: tr}, tr.CloseIdleConnections
}

// lookup reads one key for the page's key lookup.
func (c *Console) lookup(ctx context.Context, kind, scope, key, principal string) (*dedupe.Record, error) {
	k := dedupe.Key{Scope: scope, ID: key}
	if kind == "http" {
		if scope == "" {
			scope = c.cfg.HTTPScope
		}
		k = httpkey.StoredKey(scope, principal, key)
	}
	if err := k.Validate(); err != nil {
		return nil, err
	}
	rec, err := c.store.Get(ctx, k)
	if errors.Is(err, dedupe.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &rec, nil
}
