package httpkey

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Problem is the RFC 9457 problem details body of the middleware's own
// answers (Content-Type application/problem+json). Type is "about:blank"
// and Title the status's text; Reason tells the cases of one status apart.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Reason is one of the Reason… constants.
	Reason string `json:"reason"`
}

// Reasons of the middleware's problems.
const (
	ReasonKeyMissing    = "idempotency-key-missing"   // 400
	ReasonKeyMalformed  = "idempotency-key-malformed" // 400
	ReasonNoPrincipal   = "principal-missing"         // 401
	ReasonBodyTooLarge  = "body-too-large"            // 413
	ReasonBodyUnread    = "body-unreadable"           // 400
	ReasonKeyReused     = "idempotency-key-reused"    // 422
	ReasonInFlight      = "idempotency-key-in-flight" // 409
	ReasonUnavailable   = "store-unavailable"         // 503
	ReasonResponseLarge = "response-too-large"        // 500
	ReasonStoreFailed   = "store-failed"              // 500
	// ReasonPrincipalInvalid: PrincipalFunc returned a principal that a key
	// cannot hold (a control character, bytes that are not UTF-8).
	ReasonPrincipalInvalid = "principal-invalid" // 401
	// ReasonHandlerTx: the handler called Commit or Rollback on Tx (or
	// sent SQL that ends it), or answered success after a statement failed
	// in it; nothing was applied, and a retry fails the same way.
	ReasonHandlerTx = "handler-ended-transaction" // 500
	// ReasonRefused: the database refused the request's transaction for
	// good (a deferred constraint at COMMIT, say); nothing was applied,
	// and a retry is refused the same way.
	ReasonRefused = "transaction-refused" // 500
)

func writeProblem(w http.ResponseWriter, status int, reason, detail string) {
	b, _ := json.Marshal(Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, Reason: reason})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// retryAfter sets Retry-After to d in whole seconds, at least 1.
func retryAfter(w http.ResponseWriter, d time.Duration) {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	w.Header().Set("Retry-After", strconv.FormatInt(s, 10))
}
