package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// APIScope is the key scope of the ledger's HTTP API.
const APIScope = "ledger-api"

// APIConfig configures the ledger's HTTP API.
type APIConfig struct {
	// Schema holds the ledger's and exactly's tables. Defaults to "ledger".
	Schema string
	// Commands is the topic the commands go to. Defaults to
	// "ledger.commands".
	Commands string
	// KeyLayout is the key table's layout: the worker's. Defaults to
	// pgstore.LayoutPartitioned.
	KeyLayout pgstore.Layout
	// PrincipalFunc names the client a request comes from; its keys are
	// its own. Defaults to the X-Client header (no header: 401).
	PrincipalFunc httpkey.PrincipalFunc
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// APIRequest is the body of a POST /accounts/{id}/{type}.
type APIRequest struct {
	Amount int64  `json:"amount"`
	HoldID string `json:"hold_id,omitempty"`
}

// NewAPI returns the ledger's HTTP API:
//
//	POST /accounts/{id}/topup    {"amount": 100}
//	POST /accounts/{id}/hold     {"amount": 40, "hold_id": "h-1"}
//	POST /accounts/{id}/capture  {"amount": 30, "hold_id": "h-1"}
//	POST /accounts/{id}/release  {"amount": 10, "hold_id": "h-1"}
//	POST /accounts/{id}/refund   {"amount": 20, "hold_id": "h-1"}
//
// Each needs an Idempotency-Key. An accepted request gets 202 with its
// command, written to the commands topic through the outbox in the
// request's transaction: the worker applies it (or rejects it under the
// ledger's rules) and emits its event. A retry with the same key gets the
// same answer and sends no second command. Run the migrations and Setup
// first, and the worker (whose relay publishes the outbox).
func NewAPI(ctx context.Context, pool *pgxpool.Pool, cfg APIConfig) (http.Handler, error) {
	if cfg.Schema == "" {
		cfg.Schema = "ledger"
	}
	if cfg.Commands == "" {
		cfg.Commands = "ledger.commands"
	}
	if cfg.PrincipalFunc == nil {
		cfg.PrincipalFunc = func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: cfg.Schema, Layout: cfg.KeyLayout, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	if err := store.Check(ctx); err != nil {
		return nil, err
	}
	w, err := outbox.NewWriter(&outbox.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	mw, err := httpkey.New(store, &httpkey.Config{Scope: APIScope, PrincipalFunc: cfg.PrincipalFunc, Outbox: w, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	for _, typ := range []string{Topup, Hold, Capture, Release, Refund} {
		mux.Handle("POST /accounts/{id}/"+typ, mw.Wrap(commandHandler(typ, cfg.Commands)))
	}
	return mux, nil
}

// commandHandler turns a request into a command of type typ and writes
// it to topic through the outbox.
func commandHandler(typ, topic string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req APIRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			apiError(w, http.StatusBadRequest, "body: "+err.Error())
			return
		}
		// The command's ID is the request's (its key's): the same request
		// applied again, after a restore, sends the command under the same
		// ID, which the worker then finds applied. A fresh ID would apply
		// it twice.
		id, ok := httpkey.MessageID(r.Context())
		if !ok {
			apiError(w, http.StatusInternalServerError, "no Idempotency-Key")
			return
		}
		c := Command{CommandID: id, Type: typ, Account: r.PathValue("id"), Amount: req.Amount, HoldID: req.HoldID}
		payload, err := json.Marshal(c)
		if err != nil {
			apiError(w, http.StatusInternalServerError, err.Error())
			return
		}
		if _, err := Parse(payload); err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return
		}
		msg := message.NewMessage(c.CommandID, payload)
		msg.Metadata.Set(outbox.KeyMetadata, c.Account) // one account's commands in order
		if err := httpkey.WriteOutbox(r.Context(), topic, msg); err != nil {
			apiError(w, http.StatusServiceUnavailable, fmt.Sprintf("outbox: %v", err)) // 5xx: rolled back, retry
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/commands/"+c.CommandID)
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(c)
	})
}

func apiError(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail})
}
