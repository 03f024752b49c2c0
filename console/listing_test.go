package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// GETs beyond the few the console builds at once are answered 503 with
// Retry-After, not queued: an anonymous client cannot make the console
// read the dead-letter topic many times over at once.
func TestPagesBuiltAtOnceAreCapped(t *testing.T) {
	db := pgtest.New(t)
	entered, release := make(chan struct{}), make(chan struct{})
	health := func(ctx context.Context) error {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	c, err := console.New(db.Pool, &console.Config{Schema: db.Schema, Health: health, Timeout: time.Minute, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	const atOnce = 4 // console.pagesAtOnce
	var wg sync.WaitGroup
	codes := make([]int, atOnce)
	for i := range atOnce {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := http.Get(srv.URL)
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
			codes[i] = res.StatusCode
		}()
		<-entered // this GET holds a slot
	}
	type answer struct {
		code  int
		retry string
		err   error
	}
	fifth := make(chan answer, 1)
	go func() {
		res, err := http.Get(srv.URL)
		if err != nil {
			fifth <- answer{err: err}
			return
		}
		res.Body.Close()
		fifth <- answer{code: res.StatusCode, retry: res.Header.Get("Retry-After")}
	}()
	select {
	case a := <-fifth:
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.code != http.StatusServiceUnavailable || a.retry == "" {
			t.Errorf("a GET while %d pages are being built: %d, Retry-After %q; want 503 with Retry-After", atOnce, a.code, a.retry)
		}
	case <-entered:
		t.Errorf("a GET while %d pages are being built is building a page too", atOnce)
		close(release)
		<-fifth
		wg.Wait()
		return
	}
	close(release)
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusOK {
			t.Errorf("GET %d that held a slot: %d, want 200", i, code)
		}
	}
	go func() {
		for range entered { // the GET after the release
		}
	}()
	if code, _ := get(t, srv, ""); code != http.StatusOK {
		t.Errorf("a GET once the others are done: %d, want 200", code)
	}
	close(entered)
}

// A dead letter's reason is shown cut to 4 KB, as a stored result is.
func TestLongReasonIsCut(t *testing.T) {
	kafkatest.RequireReal(t)
	db := pgtest.New(t)
	brokers := kafkatest.Brokers(t)
	dlq := kafkatest.Topic(t, 1)
	reason := strings.Repeat("r", 10000)
	kw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: dlq, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer kw.Close()
	if err := kw.WriteMessages(context.Background(), kafka.Message{Key: []byte("k"), Value: []byte("v"), Headers: []kafka.Header{
		{Key: kafkapubsub.UUIDHeader, Value: []byte("0190a0e8-0000-7000-8000-0000000000d1")},
		{Key: middleware.ReasonForPoisonedKey, Value: []byte(reason)}, {Key: middleware.PoisonedTopicKey, Value: []byte("src")}}}); err != nil {
		t.Fatal(err)
	}
	c, err := console.New(db.Pool, &console.Config{Brokers: brokers, DeadLetterTopic: dlq, Schema: db.Schema, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	_, page := get(t, srv, "")
	_, cell, ok := strings.Cut(page, `<td class="reason">`)
	cell, _, _ = strings.Cut(cell, "</td>")
	if !ok || cell != strings.Repeat("r", 4096)+"… (10000 bytes)" {
		t.Errorf("the reason cell holds %d bytes, want 4096 of the reason and its length: %.120q…", len(cell), cell)
	}
}
