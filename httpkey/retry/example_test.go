package retry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/exactly-go/exactly/httpkey/retry"
)

// A server that loses its first answer (the connection closes) and then
// asks for patience (503 with Retry-After) before it answers: the client
// sends the payment three times, with one key and the same body each time,
// and gets the answer.
func Example() {
	var (
		mu   sync.Mutex
		seen []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Get("Idempotency-Key")+" "+string(body))
		n := len(seen)
		mu.Unlock()
		switch n {
		case 1:
			conn, _, _ := w.(http.Hijacker).Hijack()
			_ = conn.Close() // the answer is lost
		case 2:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":1}`)
		}
	}))
	defer srv.Close()

	client := &http.Client{Transport: retry.New(nil, &retry.Config{FirstDelay: 10 * time.Millisecond})}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":5}`))
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	key := strings.Trim(strings.Fields(seen[0])[0], `"`) // a random UUID
	for _, s := range seen {
		fmt.Println(strings.Replace(s, key, "KEY", 1))
	}
	// Output:
	// 201 {"id":1}
	// "KEY" {"amount":5}
	// "KEY" {"amount":5}
	// "KEY" {"amount":5}
}
