package gateway

import (
	"context"
	"net/http"
	"time"
)

// Hooks for the external tests (package gateway_test), which use
// demo/demotest: that package imports this one, so tests inside it
// cannot.

// RequestHash is the request hash stored for req.
func RequestHash(req ChargeRequest) string { return requestHash(req) }

// Claim claims key for req under token with lease, as a call does.
func Claim(ctx context.Context, h http.Handler, key string, req ChargeRequest, token string, lease time.Duration) (bool, error) {
	return handlerOf(h).store.claim(ctx, key, requestHash(req), req, token, lease)
}

// TakeOver takes key over under token, as a call finding an expired lease
// does.
func TakeOver(ctx context.Context, h http.Handler, key, token string, lease time.Duration) (bool, error) {
	return handlerOf(h).store.takeOver(ctx, key, token, lease)
}

// Process runs the charge of a call that claimed key under token.
func Process(ctx context.Context, h http.Handler, key, token string, req ChargeRequest) (status int, body string, replay bool, err error) {
	out, err := handlerOf(h).process(ctx, key, token, req)
	return out.status, string(out.body), out.replay, err
}

func handlerOf(h http.Handler) *handler {
	hh, ok := h.(*handler)
	if !ok {
		panic("not the gateway's handler")
	}
	return hh
}
