package httpkey

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// recorder holds a handler's response until its transaction has ended:
// nothing reaches the client before the key and the writes committed.
type recorder struct {
	header http.Header
	status int
	body   []byte
	max    int
	over   bool // the body went over max
}

func newRecorder(max int) *recorder { return &recorder{header: http.Header{}, max: max} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 && status >= 200 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if len(r.body)+len(b) > r.max {
		r.over = true
		return 0, fmt.Errorf("httpkey: response body over %d bytes (Config.MaxResponseBytes)", r.max)
	}
	r.body = append(r.body, b...)
	return len(b), nil
}

func (r *recorder) code() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// send writes the response to w as the handler made it.
func (r *recorder) send(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.header {
		h[k] = v
	}
	h.Set("Content-Length", strconv.Itoa(len(r.body)))
	w.WriteHeader(r.code())
	_, _ = w.Write(r.body)
}

// tooLarge is the answer of a lease-mode request whose handler ran (its
// effect may have happened) and answered status with a body over max: the
// status stays, the body says that it was not kept. The key is completed
// with it, so a retry gets it too instead of running the handler again.
func tooLarge(rec *recorder, max int) *recorder {
	out := newRecorder(max)
	for k, v := range rec.header {
		out.header[k] = v
	}
	out.header.Del("Content-Length")
	out.header.Set("Content-Type", "application/problem+json")
	b, _ := json.Marshal(Problem{Type: "about:blank", Title: http.StatusText(rec.code()), Status: rec.code(), Reason: ReasonResponseLarge,
		Detail: fmt.Sprintf("the request was applied, but its response was over %d bytes (Config.MaxResponseBytes) and was not kept", max)})
	out.status = rec.code()
	out.body = b
	return out
}

// stored is a response as kept with its key.
type stored struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

// encode keeps the status, the allow-listed headers and the body.
func (r *recorder) encode(allow []string) ([]byte, error) {
	s := stored{Status: r.code(), Body: r.body}
	for _, name := range allow {
		if vs := r.header.Values(name); len(vs) > 0 {
			if s.Header == nil {
				s.Header = http.Header{}
			}
			s.Header[http.CanonicalHeaderKey(name)] = vs
		}
	}
	return json.Marshal(s)
}

// replay writes a stored response to w, marked as a replay.
func replay(w http.ResponseWriter, result []byte) error {
	var s stored
	if err := json.Unmarshal(result, &s); err != nil || s.Status == 0 {
		return fmt.Errorf("httpkey: the key's stored result is not a stored response (a key of another scope?): %v", err)
	}
	h := w.Header()
	for k, v := range s.Header {
		h[k] = v
	}
	h.Set(ReplayedHeader, "true")
	h.Set("Content-Length", strconv.Itoa(len(s.Body)))
	w.WriteHeader(s.Status)
	_, _ = w.Write(s.Body)
	return nil
}
