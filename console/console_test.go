package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// servers opens a test on real servers: a database and a source and a
// dead-letter topic of its own.
func servers(t *testing.T) (db *pgtest.DB, brokers []string, source, dlq string) {
	t.Helper()
	kafkatest.RequireReal(t)
	return pgtest.New(t), kafkatest.Brokers(t), kafkatest.Topic(t, 1), kafkatest.Topic(t, 1)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// get returns the page's status and body.
func get(t *testing.T, srv *httptest.Server, query string) (int, string) {
	t.Helper()
	res, err := http.Get(srv.URL + "/?" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// post sends an action with the given form and headers, without following
// a redirect.
func post(t *testing.T, srv *httptest.Server, form url.Values, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if loc := res.Header.Get("Location"); loc != "" {
		return res.StatusCode, loc
	}
	return res.StatusCode, string(b)
}

// csrfOf is the anti-forgery field of a page's form.
func csrfOf(t *testing.T, page string) string {
	t.Helper()
	_, rest, ok := strings.Cut(page, `name="csrf" value="`)
	if !ok {
		t.Fatalf("no csrf field in the page")
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// The actions are refused unless a token or a trusted proxy header is
// configured and the request carries it; a browser's form needs the
// anti-forgery field too, and a cross-site POST is refused whatever it
// carries. The token is never written into the page.
func TestGuard(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	newServer := func(cfg console.Config) *httptest.Server {
		cfg.Schema, cfg.Logger = db.Schema, quiet()
		c, err := console.New(db.Pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(c)
		t.Cleanup(srv.Close)
		return srv
	}
	// A form that passes the guard reaches the action, which then refuses
	// its missing letter: 400, not 401 or 403.
	redrive := url.Values{"action": {"redrive"}}

	t.Run("read-only", func(t *testing.T) {
		srv := newServer(console.Config{})
		code, page := get(t, srv, "")
		if code != http.StatusOK || !strings.Contains(page, "read-only") || strings.Contains(page, `method="post"`) {
			t.Fatalf("GET: %d, want the page read-only, with no form to post:\n%s", code, page)
		}
		for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer "}, {"X-Forwarded-User": "alice"}} {
			if code, body := post(t, srv, redrive, hdr); code != http.StatusForbidden || !strings.Contains(body, "actions are off") {
				t.Errorf("POST %v: %d %s, want 403: actions are off", hdr, code, body)
			}
		}
	})

	t.Run("token", func(t *testing.T) {
		const token = "s3cret-token"
		srv := newServer(console.Config{Token: token, DeadLetterTopic: "dlq"})
		_, page := get(t, srv, "")
		if strings.Contains(page, token) {
			t.Fatal("the page holds the token")
		}
		csrf := csrfOf(t, page)
		with := func(kv ...string) url.Values {
			v := url.Values{"action": {"redrive"}}
			for i := 0; i < len(kv); i += 2 {
				v.Set(kv[i], kv[i+1])
			}
			return v
		}
		for _, tc := range []struct {
			name string
			form url.Values
			hdr  map[string]string
			want int
		}{
			{"nothing", redrive, nil, http.StatusForbidden},
			{"the token, no csrf", with("token", token), nil, http.StatusForbidden},
			{"csrf, no token", with("csrf", csrf), nil, http.StatusUnauthorized},
			{"csrf, a wrong token", with("csrf", csrf, "token", token+"x"), nil, http.StatusUnauthorized},
			{"csrf, a token's prefix", with("csrf", csrf, "token", token[:4]), nil, http.StatusUnauthorized},
			{"a wrong bearer", redrive, map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
			{"the bearer, cross-site", redrive, map[string]string{"Authorization": "Bearer " + token, "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
			{"the form, from another origin", with("csrf", csrf, "token", token), map[string]string{"Origin": "https://evil.example"}, http.StatusForbidden},
			{"a trusted header not configured", with("csrf", csrf), map[string]string{"X-Forwarded-User": "alice"}, http.StatusUnauthorized},
			{"the form", with("csrf", csrf, "token", token), nil, http.StatusBadRequest},
			{"the bearer", redrive, map[string]string{"Authorization": "Bearer " + token}, http.StatusBadRequest},
		} {
			if code, body := post(t, srv, tc.form, tc.hdr); code != tc.want {
				t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.want)
			}
		}
	})

	t.Run("trusted header", func(t *testing.T) {
		srv := newServer(console.Config{TrustedHeader: "X-Forwarded-User", DeadLetterTopic: "dlq"})
		_, page := get(t, srv, "")
		if strings.Contains(page, `name="token"`) {
			t.Fatal("the page asks for a token that is not configured")
		}
		csrf := csrfOf(t, page)
		form := url.Values{"action": {"redrive"}, "csrf": {csrf}}
		if code, body := post(t, srv, form, nil); code != http.StatusUnauthorized {
			t.Errorf("without the header: %d %s, want 401", code, body)
		}
		if code, body := post(t, srv, url.Values{"action": {"redrive"}}, map[string]string{"X-Forwarded-User": "alice"}); code != http.StatusForbidden {
			t.Errorf("the header, no csrf: %d %s, want 403", code, body)
		}
		if code, body := post(t, srv, form, map[string]string{"X-Forwarded-User": "alice"}); code != http.StatusBadRequest {
			t.Errorf("the header and csrf: %d %s, want 400 (past the guard)", code, body)
		}
		if code, body := post(t, srv, url.Values{"action": {"redrive"}}, map[string]string{"X-Forwarded-User": "alice", "Authorization": "Bearer x"}); code != http.StatusUnauthorized {
			t.Errorf("the header and a bearer with no token configured: %d %s, want 401", code, body)
		}
	})
}

// A dead letter on the page with its reason, escaped; its redrive (with
// the bearer token) publishes it back to its source as it arrived there,
// without the dead-letter headers, and records it in exactly_redrives; a
// second redrive publishes nothing. A consumer key and an HTTP key are
// found by the key lookup with where they came from and their result.
// The console runs on a pool of one connection.
func TestRedriveAndLookup(t *testing.T) {
	db, brokers, source, dlq := servers(t)
	t.Parallel()
	ctx := context.Background()
	// The console on a pool of one connection: no part of the page or of
	// a redrive may wait for a second connection while it holds one.
	pcfg, err := pgxpool.ParseConfig(db.Pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig, pcfg.MaxConns = db.Pool.Config().ConnConfig.Copy(), 1
	one, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(one.Close)
	const token = "tok"
	c, err := console.New(one, &console.Config{Brokers: brokers, Topics: []string{source}, Group: "g", DeadLetterTopic: dlq,
		Schema: db.Schema, Scope: "payments", Token: token, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)

	const id = "0190a0e8-0000-7000-8000-000000000001"
	reason := `unknown account <script>alert(1)</script>`
	kw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: dlq, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer kw.Close()
	if err := kw.WriteMessages(ctx, kafka.Message{Key: []byte("acct-9"), Value: []byte(`{"account":"acct-9"}`), Headers: []kafka.Header{
		{Key: kafkapubsub.UUIDHeader, Value: []byte(id)}, {Key: "trace", Value: []byte("t-1")},
		{Key: middleware.ReasonForPoisonedKey, Value: []byte(reason)}, {Key: middleware.PoisonedTopicKey, Value: []byte(source)},
		{Key: middleware.PoisonedHandlerKey, Value: []byte("payments")}}}); err != nil {
		t.Fatal(err)
	}
	_, page := get(t, srv, "")
	if strings.Contains(page, "<script>alert") || !strings.Contains(page, "unknown account &lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatalf("the page does not show the reason escaped:\n%s", page)
	}
	if !strings.Contains(page, `id="partitions"`) || !strings.Contains(page, "<td>"+source+"</td>") {
		t.Fatalf("the page does not show %s's partitions:\n%s", source, page)
	}
	bearer := map[string]string{"Authorization": "Bearer " + token}
	redrive := url.Values{"action": {"redrive"}, "partition": {"0"}, "offset": {"0"}}
	if code, body := post(t, srv, redrive, bearer); code != http.StatusOK || !strings.Contains(body, "redriven to "+source) {
		t.Fatalf("redrive: %d %s", code, body)
	}
	if code, body := post(t, srv, redrive, bearer); code != http.StatusOK || !strings.Contains(body, "already redriven") {
		t.Fatalf("second redrive: %d %s", code, body)
	}
	if code, body := post(t, srv, url.Values{"action": {"redrive"}, "partition": {"0"}, "offset": {"7"}}, bearer); code != http.StatusBadGateway || !strings.Contains(body, "no record at offset 7") {
		t.Fatalf("redrive of an offset with no record: %d %s, want 502", code, body)
	}
	got := kafkatest.ReadAll(t, source, 1, 5*time.Second)
	if len(got) != 1 {
		t.Fatalf("%d records in %s, want the letter once", len(got), source)
	}
	var hdrs []string
	for _, h := range got[0].Headers {
		hdrs = append(hdrs, h.Key+"="+string(h.Value))
	}
	if string(got[0].Key) != "acct-9" || strings.Join(hdrs, ",") != kafkapubsub.UUIDHeader+"="+id+",trace=t-1" {
		t.Fatalf("redriven record: key %q headers %v, want it as it arrived", got[0].Key, hdrs)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_redrives")+" WHERE dlq_topic = $1 AND message_id = $2 AND target_topic = $3",
		dlq, id, source).Scan(&n); err != nil || n != 1 {
		t.Fatalf("exactly_redrives: %d rows (%v), want 1", n, err)
	}
	if _, page = get(t, srv, ""); !strings.Contains(page, `<span class="ok">redriven</span>`) {
		t.Fatalf("the page does not show the letter redriven:\n%s", page)
	}

	// The key lookup.
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	fp := dedupe.Fingerprint(strings.Repeat("ab", 32))
	for _, req := range []dedupe.Request{
		{Key: dedupe.Key{Scope: "payments", ID: id}, Fingerprint: fp, Source: dedupe.Source{Topic: source, Partition: 0, Offset: 41}},
		{Key: httpkey.StoredKey("http", "acme", "k-1"), Fingerprint: fp},
	} {
		cl, err := store.Acquire(ctx, req, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Complete(ctx, cl, []byte(`{"result":"`+req.Key.Scope+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	_, page = get(t, srv, "kind=consumer&scope=payments&key="+id)
	if !strings.Contains(page, `<span class="ok">yes</span>`) || !strings.Contains(page, "partition 0 offset 41") ||
		!strings.Contains(page, "{&#34;result&#34;:&#34;payments&#34;}") {
		t.Fatalf("consumer key lookup:\n%s", page)
	}
	_, page = get(t, srv, "kind=http&scope=http&principal=acme&key=k-1")
	if !strings.Contains(page, `<span class="ok">yes</span>`) || !strings.Contains(page, "{&#34;result&#34;:&#34;http&#34;}") {
		t.Fatalf("HTTP key lookup:\n%s", page)
	}
	if _, page = get(t, srv, "kind=http&scope=http&principal=other&key=k-1"); !strings.Contains(page, "<b>not applied</b>") {
		t.Fatalf("HTTP key of another principal:\n%s", page)
	}
}

// writeLetter writes a dead letter of source to dlq, as a worker's
// PoisonQueue does.
func writeLetter(t *testing.T, brokers []string, dlq, source, id, reason string) {
	t.Helper()
	kw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: dlq, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer kw.Close()
	if err := kw.WriteMessages(context.Background(), kafka.Message{Key: []byte("k"), Value: []byte("v"), Headers: []kafka.Header{
		{Key: kafkapubsub.UUIDHeader, Value: []byte(id)}, {Key: middleware.ReasonForPoisonedKey, Value: []byte(reason)},
		{Key: middleware.PoisonedTopicKey, Value: []byte(source)}}}); err != nil {
		t.Fatal(err)
	}
}

// The console of a worker that runs as docs/grants.md's consumer and relay
// roles, with the grant on exactly_redrives that the page documents: every
// part of the page reads, and a redrive is recorded. Two redrives of one
// letter at once publish it once.
func TestLeastPrivilegeAndRedrivesAtOnce(t *testing.T) {
	db, brokers, source, dlq := servers(t)
	t.Parallel()
	s := pgx.Identifier{db.Schema}.Sanitize()
	q := func(table string) string { return pgx.Identifier{db.Schema, table}.Sanitize() }
	role := db.RolePool(t, "GRANT USAGE ON SCHEMA "+s+" TO {role}",
		// The consumer's.
		"GRANT SELECT, INSERT, UPDATE, DELETE ON "+q("exactly_keys2")+" TO {role}",
		"GRANT SELECT, INSERT ON "+q("exactly_key_names")+" TO {role}",
		"GRANT SELECT ON "+q("exactly_keys2_state")+" TO {role}",
		"GRANT SELECT, UPDATE ON "+q("exactly_keys")+" TO {role}",
		"GRANT SELECT, INSERT, UPDATE ON "+q("exactly_positions")+" TO {role}",
		"GRANT SELECT, INSERT, UPDATE ON "+q("exactly_scopes")+" TO {role}",
		"GRANT INSERT ON "+q("exactly_outbox")+" TO {role}",
		"GRANT USAGE ON SEQUENCE "+q("exactly_outbox_id_seq")+" TO {role}",
		// The relay's.
		"GRANT SELECT, UPDATE, DELETE ON "+q("exactly_outbox")+" TO {role}",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON "+q("exactly_outbox_waiters")+" TO {role}",
		// The console's redrive.
		"GRANT SELECT, INSERT, UPDATE ON "+q("exactly_redrives")+" TO {role}")
	const token = "tok"
	c, err := console.New(role, &console.Config{Brokers: brokers, Topics: []string{source}, Group: "g", DeadLetterTopic: dlq,
		Schema: db.Schema, Token: token, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	writeLetter(t, brokers, dlq, source, "0190a0e8-0000-7000-8000-000000000002", "refused")

	_, page := get(t, srv, "kind=consumer&scope=s&key=k")
	if strings.Contains(page, `class="err"`) {
		t.Fatalf("the page shows an error for the documented grants:\n%s", page)
	}
	for _, want := range []string{`id="partitions"`, `class="letter"`, `id="outbox"`, `id="gauges"`, "<b>not applied</b>"} {
		if !strings.Contains(page, want) {
			t.Fatalf("the page lacks %s:\n%s", want, page)
		}
	}

	bearer := map[string]string{"Authorization": "Bearer " + token}
	redrive := url.Values{"action": {"redrive"}, "partition": {"0"}, "offset": {"0"}}
	bodies := make(chan string, 2)
	for range 2 {
		go func() {
			code, body := post(t, srv, redrive, bearer)
			bodies <- fmt.Sprint(code, " ", body)
		}()
	}
	got := []string{<-bodies, <-bodies}
	slices.Sort(got)
	if !strings.Contains(got[0], "200 ") || !strings.Contains(got[1], "200 ") ||
		strings.Contains(got[0], "already") == strings.Contains(got[1], "already") {
		t.Fatalf("two redrives at once: %q, want one redriven and one already redriven", got)
	}
	if recs := kafkatest.ReadAll(t, source, 1, 3*time.Second); len(recs) != 1 {
		t.Fatalf("%d records in %s after two redrives at once, want 1", len(recs), source)
	}
}
