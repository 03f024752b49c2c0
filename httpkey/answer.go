package httpkey

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgerr"
	"github.com/exactly-go/exactly/internal/txguard"
)

// notKept carries a response that KeepFunc refused: its transaction rolled
// back, and the client gets it as is.
type notKept struct{ rec *recorder }

func (e *notKept) Error() string { return fmt.Sprintf("httpkey: response %d not kept", e.rec.code()) }

// abortedAnswer carries a kept response whose transaction a failed
// statement aborted (the handler mapped a unique or CHECK violation to a
// 4xx, say): the transaction rolls back, and the response is stored with
// the key in a transaction of its own (see storeAlone).
type abortedAnswer struct {
	rec    *recorder
	result []byte
}

func (e *abortedAnswer) Error() string {
	return fmt.Sprintf("httpkey: response %d answered on an aborted transaction", e.rec.code())
}

// errEndedOnConn: the handler ended its transaction on the connection
// itself, past the guard: what it wrote before, and the key, committed.
var errEndedOnConn = errors.New("httpkey: the handler committed or rolled back on its connection")

// errBusy: another request holds the key's lock (transactional mode).
var errBusy = errors.New("httpkey: key in flight")

// errResponseLarge: the handler's response cannot be stored.
var errResponseLarge = errors.New("httpkey: response over Config.MaxResponseBytes")

func (m *Middleware) answer(w http.ResponseWriter, q *request, rec *recorder, c dedupe.Claim, err error) {
	var (
		nk     *notKept
		reused *dedupe.KeyReusedError
		leased *dedupe.InFlightError
	)
	switch {
	case err == nil && c.Decision == dedupe.DecisionDuplicate && len(c.Record.Result) == 0:
		// Only a handler that committed on its connection, past the guard,
		// leaves a key with no stored response.
		writeProblem(w, http.StatusInternalServerError, ReasonHandlerTx, "this Idempotency-Key's request was applied, but "+
			"its handler ended the transaction on its connection before its response was stored: it cannot be replayed")
	case err == nil && c.Decision == dedupe.DecisionDuplicate:
		if rerr := replay(w, c.Record.Result); rerr != nil {
			m.cfg.Logger.ErrorContext(q.r.Context(), "httpkey: replay", "key", q.req.Key.String(), "err", rerr)
			writeProblem(w, http.StatusInternalServerError, ReasonStoreFailed, "the stored response of this key cannot be read")
		}
	case err == nil:
		rec.send(w)
	case errors.As(err, &nk):
		nk.rec.send(w)
	case errors.Is(err, errEndedOnConn):
		m.cfg.Logger.ErrorContext(q.r.Context(), "httpkey: the handler ended its transaction on its connection", "key", q.req.Key.String(), "err", err)
		writeProblem(w, http.StatusInternalServerError, ReasonHandlerTx, "the handler ended the request's transaction on "+
			"its connection: what it wrote before is committed with the key, and its response is not stored; fix the handler")
	case errors.Is(err, txguard.ErrHandlerEndedTx):
		m.cfg.Logger.ErrorContext(q.r.Context(), "httpkey: the handler broke its transaction", "key", q.req.Key.String(), "err", err)
		writeProblem(w, http.StatusInternalServerError, ReasonHandlerTx, "the handler ended or broke the request's "+
			"transaction; nothing was applied: "+err.Error())
	case errors.As(err, &reused):
		writeProblem(w, http.StatusUnprocessableEntity, ReasonKeyReused,
			"this Idempotency-Key was first used with another request (method, target, body or headers): use a new key for a new request")
	case errors.As(err, &leased):
		retryAfter(w, time.Until(leased.LockedUntil))
		writeProblem(w, http.StatusConflict, ReasonInFlight, "a request with this Idempotency-Key is being processed: retry later")
	case errors.Is(err, errBusy):
		retryAfter(w, m.cfg.RetryAfter)
		writeProblem(w, http.StatusConflict, ReasonInFlight, "a request with this Idempotency-Key is being processed: retry later")
	case errors.Is(err, errResponseLarge), errors.Is(err, dedupe.ErrResultTooLarge):
		writeProblem(w, http.StatusInternalServerError, ReasonResponseLarge, "the response is too large to be stored with its key; nothing was applied")
	case errors.Is(err, dedupe.ErrMisconfigured), pgerr.IsConfiguration(err):
		m.cfg.Logger.ErrorContext(q.r.Context(), "httpkey: store misconfigured", "key", q.req.Key.String(), "err", err)
		writeProblem(w, http.StatusInternalServerError, ReasonStoreFailed, "the idempotency store is misconfigured; nothing was applied")
	case refusedForGood(err):
		// The database answered, and no retry changes its answer (a
		// deferred constraint refused at COMMIT, say).
		m.cfg.Logger.ErrorContext(q.r.Context(), "httpkey: the database refused the request", "key", q.req.Key.String(), "err", err)
		writeProblem(w, http.StatusInternalServerError, ReasonRefused, "the database refused this request's transaction "+
			"("+pgMessage(err)+"); nothing was applied, and the same request will be refused again")
	default:
		// The database failed, or the request's deadline passed before
		// its outcome was written: nothing was applied, or what was is
		// the key's, and a retry with the key gets it.
		m.cfg.Logger.WarnContext(q.r.Context(), "httpkey: request not applied", "key", q.req.Key.String(), "err", err)
		retryAfter(w, m.cfg.RetryAfter)
		writeProblem(w, http.StatusServiceUnavailable, ReasonUnavailable,
			"the request could not be recorded: retry with the same Idempotency-Key (if it was applied, the retry gets its response)")
	}
}

// refusedForGood reports whether err is the database's own answer that a
// retry would get again: not a transient failure (serialisation, deadlock,
// lock timeout, a shutdown), not a failure of the server or the
// connection.
func refusedForGood(err error) bool {
	answered, serverFault := pgerr.Answered(err)
	return answered && !serverFault && !pgerr.IsRetryable(err) && !dedupe.IsRetryable(err)
}

// pgMessage is the database's message in err, with its SQLSTATE.
func pgMessage(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message + ", SQLSTATE " + pe.Code
	}
	return err.Error()
}
