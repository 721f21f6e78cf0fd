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
	body, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{Type: errorType(status), Code: code, Message: message, Param: param}})
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
