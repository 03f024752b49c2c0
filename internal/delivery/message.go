package delivery

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/msgid"
)

// Header is a record header of either transport (kafka-go's kafka.Header,
// franz-go's kgo.RecordHeader).
type Header interface {
	~struct {
		Key   string
		Value []byte
	}
}

// header is what every Header is.
type header = struct {
	Key   string
	Value []byte
}

// arrivedKey carries, in the context of a message a Subscriber delivers,
// the record (of type R) as it arrived.
type arrivedKey[R any] struct{}

// WithArrived returns ctx carrying r, the record a message was made of.
func WithArrived[R any](ctx context.Context, r *R) context.Context {
	return context.WithValue(ctx, arrivedKey[R]{}, r)
}

// Arrived returns the record msg was made of when msg is a message a
// Subscriber delivered, published again under the ID it arrived with (a
// dead letter, a message forwarded as it is), and nil otherwise. uuid is
// the message ID a record arrived with.
func Arrived[R any](msg *message.Message, uuid func(*R) string) *R {
	r, _ := msg.Context().Value(arrivedKey[R]{}).(*R)
	if r == nil || msg.UUID != uuid(r) {
		return nil
	}
	return r
}

// Last is the value of the last of headers named name ("" for none): the
// message ID a record arrived with, for the transports' UUIDHeader.
func Last[H Header](headers []H, name string) string {
	var v string
	for _, h := range headers {
		if h := header(h); h.Key == name {
			v = string(h.Value)
		}
	}
	return v
}

// AsArrived returns the headers of a record that is one as it arrived, with
// headers arrived, with the changes of md, the metadata of the message
// made of it: its headers in their order, a repeated name included, and
// its message ID header (named uuidHeader) only if it had one; a header
// whose metadata the handler changed or deleted is left out, and metadata
// the record did not carry (a dead letter's reasons) and reserved does not
// refuse follows it, sorted by name.
func AsArrived[H Header](arrived []H, md message.Metadata, uuidHeader string, reserved func(string) bool) []H {
	last := make(map[string]string, len(arrived))
	for _, h := range arrived {
		h := header(h)
		last[h.Key] = string(h.Value)
	}
	headers := make([]H, 0, len(arrived)+len(md))
	for _, h := range arrived {
		hh := header(h)
		if hh.Key == uuidHeader {
			headers = append(headers, h)
			continue
		}
		if v, ok := md[hh.Key]; ok && v == last[hh.Key] {
			headers = append(headers, h)
		}
	}
	var added []string
	for k, v := range md {
		if reserved(k) {
			continue
		}
		if was, ok := last[k]; !ok || was != v {
			added = append(added, k)
		}
	}
	slices.Sort(added)
	for _, k := range added {
		headers = append(headers, H(header{Key: k, Value: []byte(md[k])}))
	}
	return headers
}

// Outgoing makes the record (of the transport's type R) that publishes m
// to topic, key giving its partition key; name (the transport's package)
// starts its errors. A message a Subscriber delivered and published again
// under the ID it arrived with (a dead letter: arrived finds its record)
// goes out as the record it was (asArrived), with no ID when it arrived
// with none; any other goes out as fresh makes it, with a UUIDv7, written
// into it, when it has no UUID.
func Outgoing[A, R any](name, topic string, m *message.Message, arrived func(*message.Message) *A, key func(string, *message.Message) ([]byte, error),
	asArrived func(string, *message.Message, *A, []byte) R, fresh func(string, *message.Message, []byte) R,
) (R, error) {
	a := arrived(m)
	if a == nil && m.UUID == "" {
		m.UUID = msgid.New()
	}
	k, err := key(topic, m)
	if err != nil {
		var zero R
		return zero, fmt.Errorf("%s: publish %s to %s: partition key: %w", name, m.UUID, topic, err)
	}
	if a != nil {
		return asArrived(topic, m, a, k), nil
	}
	return fresh(topic, m, k), nil
}

// Stamps formats the timestamps of one partition's records as their
// metadata (RFC 3339 with nanoseconds, in UTC), once for each run of
// records that share one (a producer's batch, mostly, at the
// milliseconds Kafka keeps). Its zero value is ready; a nil *Stamps
// formats each time. It is used by one goroutine.
type Stamps struct {
	t time.Time
	s string
}

// Format returns t formatted.
func (st *Stamps) Format(t time.Time) string {
	if st == nil {
		return t.UTC().Format(time.RFC3339Nano)
	}
	if st.s == "" || !t.Equal(st.t) {
		st.t, st.s = t, t.UTC().Format(time.RFC3339Nano)
	}
	return st.s
}
