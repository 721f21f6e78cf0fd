package payments_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/demo/payments"
	"github.com/onceonly/onceonly/oncetest"
)

// documentedCodes reads docs/openapi.yaml: operation ("POST /v1/payments")
// → its response codes.
func documentedCodes(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/openapi.yaml")
	require.NoError(t, err)
	var spec struct {
		OpenAPI string                                                   `yaml:"openapi"`
		Paths   map[string]map[string]struct{ Responses map[string]any } `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &spec))
	require.True(t, strings.HasPrefix(spec.OpenAPI, "3."))
	ops := map[string][]string{}
	for path, methods := range spec.Paths {
		for method, op := range methods {
			for code := range op.Responses {
				ops[strings.ToUpper(method)+" "+path] = append(ops[strings.ToUpper(method)+" "+path], code)
			}
		}
	}
	return ops
}

// TestOpenAPIMatchesTheHandler drives the real handler through every answer
// it can give and checks both ways: every documented code was produced, and
// every produced code is documented.
func TestOpenAPIMatchesTheHandler(t *testing.T) {
	b := setup(t, setupOpts{})
	produced := map[string][]string{}
	var mu sync.Mutex
	record := func(op string, res response) response {
		mu.Lock()
		defer mu.Unlock()
		code := strconv.Itoa(res.status)
		if !slices.Contains(produced[op], code) {
			produced[op] = append(produced[op], code)
		}
		return res
	}
	const create, read = "POST /v1/payments", "GET /v1/payments/{id}"
	auth := map[string]string{"Authorization": "Bearer " + apiKey}
	jsonHeaders := func(key string) map[string]string {
		return map[string]string{"Authorization": "Bearer " + apiKey, "Idempotency-Key": key, "Content-Type": "application/json"}
	}
	pay := func(key, body string) response { return record(create, b.pay(t, 0, key, body)) }

	created := pay("oa-1", visa)
	require.Equal(t, http.StatusCreated, created.status)
	pay("oa-1", visa)                                                       // replay
	pay("oa-1", strings.Replace(visa, "1000", "1001", 1))                   // 422
	pay("oa-2", strings.Replace(visa, "tok_visa", "tok_chargeDeclined", 1)) // 402
	pay("oa-3", strings.Replace(visa, "tok_visa", "tok_gatewayError", 1))   // 502
	pay("oa-4", `{"amount":0}`)                                             // 400
	record(create, b.do(t, "POST", "/v1/payments", map[string]string{"Authorization": "Bearer nope"}, strings.NewReader(visa)))
	record(create, b.do(t, "POST", "/v1/payments", map[string]string{"Authorization": "Bearer " + apiKey, "Idempotency-Key": "oa-5", "Content-Type": "text/plain"}, strings.NewReader(visa)))
	record(create, b.do(t, "POST", "/v1/payments", jsonHeaders("oa-6"), strings.NewReader(`{"customer":"`+strings.Repeat("x", 70<<10)+`"}`)))
	record(create, b.do(t, "DELETE", "/v1/payments", auth, nil))
	slow := strings.Replace(visa, "tok_visa", "tok_slow", 1)
	var wg sync.WaitGroup
	var slowErr error
	wg.Go(func() {
		var res response
		if res, slowErr = b.tryPay(0, "oa-7", slow); slowErr == nil {
			record(create, res)
		}
	})
	oncetest.AwaitClaimed(t, b.ctx, b.pool, "oa-7")
	require.Equal(t, http.StatusConflict, pay("oa-7", slow).status)
	wg.Wait()
	require.NoError(t, slowErr)

	var p struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(created.body), &p))
	record(read, b.do(t, "GET", "/v1/payments/"+p.ID, auth, nil))
	record(read, b.do(t, "GET", "/v1/payments/pay_missing", auth, nil))
	record(read, b.do(t, "GET", "/v1/payments/"+p.ID, map[string]string{"Authorization": "Bearer sk_test_2"}, nil))
	record(read, b.do(t, "GET", "/v1/payments/"+p.ID, nil, nil))
	record(read, b.do(t, "PUT", "/v1/payments/"+p.ID, auth, nil))

	// 503: an api whose Postgres is gone.
	pool := oncetest.Pool(t, b.dbURL)
	engine, err := onceonly.New(onceonly.Config{Pool: pool})
	require.NoError(t, err)
	down := httptest.NewServer(payments.NewHandler(payments.Config{Engine: engine, Pool: pool,
		APIKeys: map[string]string{apiKey: "acct_1"}, Logger: oncetest.QuietLogger()}))
	defer down.Close()
	pool.Close()
	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, down.URL+"/v1/payments", strings.NewReader(visa))
	require.NoError(t, err)
	for k, v := range jsonHeaders("oa-8") {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	record(create, response{status: res.StatusCode})

	documented := documentedCodes(t)
	require.ElementsMatch(t, []string{create, read}, mapsKeys(documented))
	for op, codes := range documented {
		require.ElementsMatch(t, codes, produced[op], "%s: documented vs produced", op)
	}
}

func mapsKeys(m map[string][]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
