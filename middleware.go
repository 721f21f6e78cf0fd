package onceonly

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/onceonly/onceonly/internal/canonjson"
	"github.com/onceonly/onceonly/keystate"
)

// HeaderKey is the request header carrying the idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on replayed responses.
const HeaderReplayed = "Idempotent-Replayed"

// DefaultMaxBody is the largest request body the middleware reads (64 KiB).
const DefaultMaxBody = 64 << 10

// MiddlewareOptions configures Middleware.
type MiddlewareOptions struct {
	// Scope returns the scope of a request (the tenant, merchant or user
	// whose keys must never meet another's). Required: Middleware panics
	// without it. A service with a single tenant returns a constant.
	Scope func(r *http.Request) (string, error)
	// MaxBody is the largest request body accepted (DefaultMaxBody).
	MaxBody int64
	// Methods are the methods the middleware guards (default POST and
	// PATCH, which are not idempotent by themselves); requests with any
	// other method pass through to the handler untouched.
	Methods []string
	// StoreHeaders, when set, lists the only response headers stored and
	// replayed besides Content-Type; by default every header the handler
	// sets is, but Content-Length, Date and hop-by-hop headers.
	StoreHeaders []string
	// StoreRequestHeaders, when set, lists the only request headers a
	// named handler's key (Name) keeps with its request for a resumption,
	// which the console shows too: exactly these, credential-like or not.
	// By default every request header is kept but credential-like ones
	// (IsCredentialHeader): list the headers the resumption needs to keep
	// no more than those.
	StoreRequestHeaders []string
	// KeyOptional lets a guarded request without an Idempotency-Key header
	// pass through untouched (it runs as it would without the middleware);
	// by default such a request gets 400 idempotency_key_missing. A key that
	// is present is always validated.
	KeyOptional bool
	// Name registers the wrapped handler under this name (Engine.Register),
	// so it may call systems outside Postgres through Step and a live engine
	// can finish an execution whose process died after a step started: it
	// runs the handler again on the stored request (method, URI, headers
	// but credential-like ones, see StoreRequestHeaders, body), with the
	// scope from
	// ExecutionOf(ctx).Scope(), since the middlewares in front of this one
	// do not run then. Names are unique per engine; a duplicate panics.
	Name string
	// Fingerprint computes what identifies a guarded request, from the
	// request and its whole body: the same key with another fingerprint
	// answers 422. An error answers 400; return an *HTTPError to choose its
	// code and message. Default: RequestFingerprint (method, path, query and
	// canonical JSON body), which also honours keys stored under its older
	// version.
	Fingerprint func(r *http.Request, body []byte) (string, error)
	// Wait, when positive, makes a request whose key another request holds
	// wait up to this long for that request's answer and get it replayed,
	// instead of a 409 right away. It is woken through Redis when the key
	// settles (and looks again every second, or polls Postgres when Redis
	// is unavailable); past Wait it gets the 409 with Retry-After. Each
	// waiting request holds one Redis connection.
	Wait time.Duration
	// WriteError writes the middleware's own error answers (400, 401, 409,
	// 413, 422, 503) in the service's error format. Retry-After is already
	// set when it is called. Default: WriteProblem.
	WriteError func(w http.ResponseWriter, r *http.Request, e *HTTPError)
}

// HTTPError is an answer the middleware gives without running the handler.
// It is an error, so a Fingerprint hook can return one.
type HTTPError struct {
	// Status is the HTTP status code.
	Status int
	// Code is a stable machine-readable reason, e.g. "idempotency_key_in_use".
	Code string
	// Message is a sentence for people.
	Message string
	// Param names the offending header or field, if any.
	Param string
}

// Error returns the message.
func (e *HTTPError) Error() string { return e.Message }

// WriteProblem writes e as RFC 9457 problem details
// (application/problem+json) with its code as an extension member.
func WriteProblem(w http.ResponseWriter, _ *http.Request, e *HTTPError) {
	body, err := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
		Code   string `json:"code"`
		Param  string `json:"param,omitempty"`
	}{"about:blank", http.StatusText(e.Status), e.Status, e.Message, e.Code, e.Param})
	if err != nil { // unreachable: strings and an int always encode
		body = []byte(`{"type":"about:blank","status":` + strconv.Itoa(e.Status) + `}`)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(body, '\n'))
}

// Middleware makes the wrapped handler run once per (scope, Idempotency-Key).
// The first request runs it as an execution: its business writes go
// through Tx(r.Context()), which commits together with the key's
// completion, after any Step (with MiddlewareOptions.Name). The status,
// Content-Type and body it writes are stored; retries get them back
// byte-identical with Idempotent-Replayed: true. Errors are JSON:
// 400 for a missing or invalid key or a body that is not JSON, 409 with
// Retry-After while another request holds the key, 413 for a body over
// MaxBody, 422 for a key reused with another payload, 503 with Retry-After
// when Postgres is unreachable.
//
// Middleware panics, when it is called, without opts.Scope or on an Engine
// New did not make (as it does for a Name registered twice, when the
// handler is wrapped): a misconfiguration of the code, found at start, not
// at the first request.
func (e *Engine) Middleware(opts MiddlewareOptions) func(http.Handler) http.Handler {
	if err := e.made(); err != nil {
		panic(err)
	}
	if opts.Scope == nil {
		panic(errNoScope)
	}
	if opts.MaxBody <= 0 {
		opts.MaxBody = DefaultMaxBody
	}
	if opts.WriteError == nil {
		opts.WriteError = WriteProblem
	}
	if opts.Methods == nil {
		opts.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	guarded := make(map[string]bool, len(opts.Methods))
	for _, m := range opts.Methods {
		guarded[strings.ToUpper(m)] = true
	}
	return func(next http.Handler) http.Handler {
		if opts.Name != "" {
			if err := e.Register(opts.Name, resumeHTTP(next, opts.StoreHeaders)); err != nil {
				panic(err)
			}
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fail := func(status int, code, message, param string) {
				opts.WriteError(w, r, &HTTPError{Status: status, Code: code, Message: message, Param: param})
			}
			key, present := r.Header[http.CanonicalHeaderKey(HeaderKey)]
			if !guarded[r.Method] || (!present && opts.KeyOptional) {
				next.ServeHTTP(w, r)
				return
			}
			if !present {
				fail(http.StatusBadRequest, "idempotency_key_missing", "The Idempotency-Key header is required.", HeaderKey)
				return
			}
			if len(key) != 1 || ValidateKey(key[0]) != nil {
				fail(http.StatusBadRequest, "idempotency_key_invalid", "Idempotency-Key must be 1 to 255 printable ASCII characters without spaces.", HeaderKey)
				return
			}
			scope, err := opts.Scope(r)
			if err != nil || ValidateScope(scope) != nil {
				fail(http.StatusUnauthorized, "unauthorized", "The request has no valid scope.", "")
				return
			}
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, opts.MaxBody))
			if err != nil {
				if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
					fail(http.StatusRequestEntityTooLarge, "request_too_large",
						"The request body is larger than "+strconv.FormatInt(opts.MaxBody, 10)+" bytes.", "")
					return
				}
				fail(http.StatusBadRequest, "invalid_request", "The request body could not be read.", "")
				return
			}
			fp, err := fingerprintRequest(r, body, opts.Fingerprint)
			if err != nil {
				herr, ok := errors.AsType[*HTTPError](err)
				if !ok {
					herr = &HTTPError{Status: http.StatusBadRequest, Code: "invalid_request", Message: "The request could not be fingerprinted: " + err.Error()}
				}
				opts.WriteError(w, r, herr)
				return
			}
			request := func() []byte { return encodeRequest(r, body, opts.StoreRequestHeaders) }
			run := func(ctx context.Context) (Outcome, error) {
				return e.execute(ctx, e.modeFor(), scope, key[0], fp, opts.Name, request, func(ctx context.Context, _ *Execution) (Result, error) {
					inner := r.WithContext(ctx)
					inner.Body = io.NopCloser(bytes.NewReader(body))
					return serve(next, inner, opts.StoreHeaders), nil
				})
			}
			out, err := run(r.Context())
			if _, inFlight := IsInFlight(err); inFlight && opts.Wait > 0 {
				out, err = e.await(r.Context(), keystate.Ref{Scope: scope, Key: key[0]}, opts.Wait, run)
			}
			if err != nil {
				if answersUnavailable(err) {
					e.log.Warn("answer 503", "scope", scope, "key", key[0], "err", err)
				}
				writeEngineError(w, err, fail)
				return
			}
			if out.Replayed {
				w.Header().Set(HeaderReplayed, "true")
			}
			writeResult(w, out.Result)
		})
	}
}

// RequestFingerprint is the default MiddlewareOptions.Fingerprint, and the
// one fingerprint entry point: a SHA-256 over the method, the path, the
// query (parameters sorted by name, the values of one name kept in their
// order) and the body of r; a JSON body is canonicalized first (members
// sorted, no insignificant whitespace, numbers in their shortest form), so
// whitespace, member order and parameter order do not make another
// request, and another body is hashed as it is. A body that is
// not JSON or names a member twice is an *HTTPError 400 invalid_json, a
// query that does not parse a 400 invalid_request.
func RequestFingerprint(r *http.Request, body []byte) (string, error) {
	fp, err := defaultFingerprint(r, body)
	return fp.value, err
}

// fingerprintRequest fingerprints r with custom, or with the default, which
// also knows the older version of itself.
func fingerprintRequest(r *http.Request, body []byte, custom func(*http.Request, []byte) (string, error)) (fingerprint, error) {
	if custom == nil {
		return defaultFingerprint(r, body)
	}
	fp, err := custom(r, body)
	return fingerprint{value: fp}, err
}

func defaultFingerprint(r *http.Request, body []byte) (fingerprint, error) {
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return fingerprint{}, &HTTPError{Status: http.StatusBadRequest, Code: "invalid_request", Message: "The query string is malformed."}
	}
	if mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mediaType == "application/json" || len(body) == 0 {
		canonical, err := canonjson.Canonical(body)
		if err != nil {
			message := "The request body is not valid JSON."
			if errors.Is(err, canonjson.ErrDuplicateName) {
				message = "The request body names an object member twice."
			}
			return fingerprint{}, &HTTPError{Status: http.StatusBadRequest, Code: "invalid_json", Message: message}
		}
		body = canonical
	}
	return fingerprint{
		value:  requestFingerprint(r.Method, r.URL.Path, query, body),
		legacy: func() string { return legacyFingerprint(r.Method, r.URL.Path, body) },
	}, nil
}

// writeResult writes a stored or fresh result.
func writeResult(w http.ResponseWriter, res Result) {
	maps.Copy(w.Header(), res.Header)
	if res.ContentType != "" {
		w.Header().Set("Content-Type", res.ContentType)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(res.Body)))
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// answersUnavailable reports whether writeEngineError answers err with a
// 503.
func answersUnavailable(err error) bool {
	_, inFlight := IsInFlight(err)
	return !inFlight && !errors.Is(err, ErrKeyReused) && !errors.Is(err, ErrLeaseLost) && !errors.Is(err, context.Canceled)
}

// writeEngineError answers an error of the engine through fail.
func writeEngineError(w http.ResponseWriter, err error, fail func(status int, code, message, param string)) {
	if inFlight, ok := IsInFlight(err); ok {
		// RetryAfter is at most MaxInFlightRetry: the remaining lease is the
		// worst case (the holder died); a live holder usually finishes much
		// sooner, and a retry that comes early costs one Redis round trip.
		writeRetryAfter(w, min(inFlight.RetryAfter, MaxInFlightRetry).Seconds())
		fail(http.StatusConflict, "idempotency_key_in_use",
			"A request with this Idempotency-Key is already in progress; retry later.", "")
		return
	}
	switch {
	case errors.Is(err, ErrKeyReused):
		fail(http.StatusUnprocessableEntity, "idempotency_key_reused",
			"This Idempotency-Key was already used with a different request.", "")
	case errors.Is(err, ErrLeaseExpired):
		writeRetryAfter(w, 1)
		fail(http.StatusServiceUnavailable, "service_unavailable",
			"The request ran longer than its lease allows and was stopped; nothing was saved. Retry.", "")
	case errors.Is(err, ErrLeaseLost):
		writeRetryAfter(w, 1)
		fail(http.StatusConflict, "idempotency_key_in_use",
			"Another request took this Idempotency-Key over; retry later.", "")
	case errors.Is(err, context.Canceled):
		// The client is gone; nothing it could read.
		w.WriteHeader(statusClientClosedRequest)
	default:
		writeRetryAfter(w, 1)
		fail(http.StatusServiceUnavailable, "service_unavailable",
			"The service is temporarily unavailable; retry later.", "")
	}
}

// statusClientClosedRequest is the status logged for a request whose client
// went away (nginx's 499); the client never reads it.
const statusClientClosedRequest = 499

func writeRetryAfter(w http.ResponseWriter, seconds float64) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(seconds)))))
}

// serve runs h on r and returns what it wrote, keeping only the headers
// keep names (all storable ones when keep is nil).
func serve(h http.Handler, r *http.Request, keep []string) Result {
	rec := &recorder{header: http.Header{}}
	h.ServeHTTP(rec, r)
	return rec.result(keep)
}

// storedRequest is an HTTP request as an execution keeps it for a
// resumption.
type storedRequest struct {
	Method string      `json:"method"`
	URI    string      `json:"uri"`
	Header http.Header `json:"header"`
	Body   []byte      `json:"body"`
}

// credentialWords are what the lower-cased name of a credential-like
// request header contains (IsCredentialHeader).
var credentialWords = []string{
	"auth", "token", "secret", "password", "passwd", "api-key", "apikey", "access-key",
	"session", "cookie", "signature", "credential", "csrf", "xsrf", "jwt",
}

// IsCredentialHeader reports whether a request header of this name is
// taken to carry a credential, which the middleware does not keep with a
// request for its resumption unless MiddlewareOptions.StoreRequestHeaders
// names it: its name, in any case, contains "auth" (Authorization,
// Proxy-Authorization, X-Auth-Token), "token" (X-Amz-Security-Token,
// X-CSRF-Token), "secret", "password", "passwd", "api-key" (X-Api-Key),
// "apikey", "access-key", "session", "cookie", "signature", "credential",
// "csrf", "xsrf" or "jwt".
func IsCredentialHeader(name string) bool {
	name = strings.ToLower(name)
	return slices.ContainsFunc(credentialWords, func(word string) bool { return strings.Contains(name, word) })
}

// encodeRequest encodes r and its body for a resumption, with the headers
// named in keep, or all but the credential-like ones when keep is nil.
func encodeRequest(r *http.Request, body []byte, keep []string) []byte {
	drop := IsCredentialHeader
	if keep != nil {
		drop = func(string) bool { return false }
	}
	h := filterHeader(r.Header, keep, drop)
	raw, err := json.Marshal(storedRequest{Method: r.Method, URI: r.URL.RequestURI(), Header: h, Body: body})
	if err != nil {
		panic("onceonly: an HTTP request does not encode as JSON: " + err.Error()) // unreachable: strings and bytes
	}
	return raw
}

// resumeHTTP returns the Func that resumes an execution of h: h runs again
// on the stored request.
func resumeHTTP(h http.Handler, keep []string) Func {
	return func(ctx context.Context, x *Execution) (Result, error) {
		var sr storedRequest
		if err := json.Unmarshal(x.Request(), &sr); err != nil {
			return Result{}, fmt.Errorf("decode stored request: %w", err)
		}
		r, err := http.NewRequestWithContext(ctx, sr.Method, sr.URI, bytes.NewReader(sr.Body))
		if err != nil {
			return Result{}, fmt.Errorf("rebuild stored request: %w", err)
		}
		if sr.Header != nil { // nil when no header was kept
			r.Header = sr.Header
		}
		return serve(h, r, keep), nil
	}
}

// recorder captures what the wrapped handler writes.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

func (r *recorder) result(keep []string) Result {
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	return Result{Status: status, ContentType: r.header.Get("Content-Type"), Header: storable(r.header, keep), Body: r.body.Bytes()}
}

// unstoredHeaders are never stored with a response: the framing and the
// date belong to each answer, hop-by-hop headers to each connection, and
// Content-Type is stored on its own (Idempotent-Replayed is the engine's).
var unstoredHeaders = map[string]bool{
	"Content-Type": true, "Content-Length": true, "Date": true, "Connection": true, "Keep-Alive": true,
	"Proxy-Authenticate": true, "Proxy-Authorization": true, "Te": true, "Trailer": true,
	"Transfer-Encoding": true, "Upgrade": true, HeaderReplayed: true,
}

// storable returns the headers of a response that are stored: those named
// in keep, or every one, but unstoredHeaders either way.
func storable(h http.Header, keep []string) http.Header {
	return filterHeader(h, keep, func(name string) bool { return unstoredHeaders[name] })
}

// filterHeader returns the headers of h named in keep (every one when keep
// is nil) but those drop refuses (it gets canonical names); nil when none
// is left.
func filterHeader(h http.Header, keep []string, drop func(name string) bool) http.Header {
	out := http.Header{}
	add := func(name string, v []string) {
		if name = http.CanonicalHeaderKey(name); len(v) > 0 && !drop(name) {
			out[name] = v
		}
	}
	if keep != nil {
		for _, name := range keep {
			add(name, h.Values(name))
		}
	} else {
		for name, v := range h {
			add(name, v)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
