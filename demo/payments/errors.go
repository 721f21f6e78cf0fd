package payments

import (
	"encoding/json"
	"net/http"

	"github.com/onceonly/onceonly"
)

// writeError writes the API's error envelope, in Stripe's style:
// {"error":{"type":…,"code":…,"message":…,"param":…}}.
func writeError(w http.ResponseWriter, status int, code, message, param string) {
	type apiError struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
		Param   string `json:"param,omitempty"`
	}
	writeJSON(w, status, struct {
		Error apiError `json:"error"`
	}{apiError{Type: errorType(status), Code: code, Message: message, Param: param}})
}

// unencodable is the answer when a response cannot be encoded: a bug,
// answered as one rather than with an empty body.
const unencodable = `{"error":{"type":"api_error","code":"internal_error","message":"The response could not be encoded."}}`

// writeJSON writes v as the JSON body of a status response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(unencodable)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// writeEngineError writes the idempotency middleware's answers (409, 422,
// 503…) in the API's envelope.
func writeEngineError(w http.ResponseWriter, _ *http.Request, e *onceonly.HTTPError) {
	writeError(w, e.Status, e.Code, e.Message, e.Param)
}

func errorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusPaymentRequired:
		return "card_error"
	case status == http.StatusConflict || status == http.StatusUnprocessableEntity:
		return "idempotency_error"
	case status >= http.StatusInternalServerError:
		return "api_error"
	}
	return "invalid_request_error"
}
